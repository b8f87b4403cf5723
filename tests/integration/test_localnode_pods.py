"""Pods of the real control plane run as processes on the local node."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from support.localnode import LocalCluster
from support.localnode.api import Json


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def pod(name: str, command: list[str], **spec: Any) -> Json:
    container = {"name": "main", "image": "local", "command": command}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


def test_exit_code_and_termination_message(local_cluster: LocalCluster, pod_namespace: str) -> None:
    api = local_cluster.api
    script = "echo -n 'rank 0 tripped: loss spike' > /dev/termination-log; echo hello; exit 3"
    api.post(f"/api/v1/namespaces/{pod_namespace}/pods", pod("exits", ["sh", "-c", script]))
    path = f"/api/v1/namespaces/{pod_namespace}/pods/exits"

    def terminated() -> Json | None:
        found = api.get(path)
        assert found is not None
        statuses = found["status"].get("containerStatuses") or []
        if statuses and "terminated" in statuses[0]["state"]:
            return found
        return None

    done = wait_for(terminated, 30, "the container to terminate")
    state = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 3, state
    assert state["message"] == "rank 0 tripped: loss spike"
    assert done["status"]["phase"] == "Failed"
    assert done["spec"]["nodeName"] in ("node-a", "node-b")
    assert "hello" in local_cluster.logs(pod_namespace, "exits")
