"""Small helpers for tests that run pods on the local node: waiting and minimal manifests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from support.localnode.api import Json, RawApi

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """Polls until `check` returns something truthy; the error says what never happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def pod_manifest(name: str, command: list[str], **spec: Any) -> Json:
    """A one-container pod (restartPolicy Never unless given); `container=` adds fields to it."""
    container: Json = {"name": "main", "image": "local", "command": command}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {})},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


def headless_service(name: str, selector: dict[str, str]) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"clusterIP": "None", "selector": selector, "ports": [{"port": 1}]},
    }


def create(api: RawApi, namespace: str, kind: str, manifest: Json) -> Json:
    return api.post(f"/api/v1/namespaces/{namespace}/{kind}", manifest)


def read_pod(api: RawApi, namespace: str, name: str) -> Json | None:
    return api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def terminated(api: RawApi, namespace: str, name: str, container: int = 0) -> Json | None:
    """The container's terminated state once it has one (and will not be restarted)."""
    pod = read_pod(api, namespace, name)
    if pod is None:
        return None
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if len(statuses) > container and "terminated" in statuses[container]["state"]:
        state: Json = statuses[container]["state"]["terminated"]
        return state
    return None


def wait_terminated(api: RawApi, namespace: str, name: str, timeout: float = 60) -> Json:
    return wait_for(lambda: terminated(api, namespace, name), timeout, f"pod {name} to finish")
