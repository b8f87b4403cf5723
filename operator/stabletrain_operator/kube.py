"""The few Kubernetes API calls the reconcile makes, synchronous (run in a worker thread).

Creates treat 409 as success (names are deterministic: the object is the one an earlier,
interrupted tick made), deletes treat 404 as success, and the status write carries the
resourceVersion the tick read, so a write based on a stale read fails with 409 instead of
overwriting a newer state (which matters with several operator replicas).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from stabletrain_operator.api.cluster_policy import POLICY_PLURAL
from stabletrain_operator.api.constants import API_VERSION, GROUP, KIND, PLURAL, VERSION

Json = dict[str, Any]
T = TypeVar("T")
MERGE_PATCH = "application/merge-patch+json"

_log = logging.getLogger(__name__)


FANOUT = 8
"""Requests of one launch or one stop in flight at once. One after another, a 256-pod job
took 60 s to stop and 65 s to relaunch on the local control plane (bench/operator_scale.py
--big-job 256)."""
CONNECTION_POOL = 32
"""Connections to the API server kept for reuse: the reconciles' worker threads and a
launch's FANOUT together, which the client's default (5 per core) would discard and reopen."""


def each(call: Callable[[T], object], items: Sequence[T]) -> None:
    """`call(item)` for every item, FANOUT at a time; every call runs even when one fails,
    and then the first failure is raised (the next tick retries what it stands for)."""
    if len(items) <= 1:
        for item in items:
            call(item)
        return
    with ThreadPoolExecutor(max_workers=min(FANOUT, len(items))) as pool:
        futures = [pool.submit(call, item) for item in items]
    for future in futures:
        future.result()


class StaleStatusError(Exception):
    """The job changed since this tick read it; the next tick starts from the new state."""


def load_api_client() -> client.ApiClient:
    """In-cluster service account when running in a pod, else the kubeconfig (tests, dev)."""
    loaders: Any = config  # the kubernetes package ships its config loaders untyped
    try:
        loaders.load_incluster_config()
    except config.ConfigException:
        loaders.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = CONNECTION_POOL
    return client.ApiClient(configuration)


class Kube:
    def __init__(self, api_client: client.ApiClient) -> None:
        # Typed as Any: we send plain dicts (what the pydantic-typed client also accepts on
        # the wire) and read plain dicts back from the custom-objects API.
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)

    def create(self, obj: Json) -> bool:
        """Create `obj` in its namespace; False when it already existed."""
        namespace = obj["metadata"]["namespace"]
        creator = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
            "Secret": self.core.create_namespaced_secret,
        }[obj["kind"]]
        try:
            creator(namespace, obj)
        except ApiException as error:
            if error.status == HTTPStatus.CONFLICT:
                return False
            raise
        return True

    def replace_config_map(self, obj: Json) -> None:
        """Create or overwrite (the skip-list spill grows with every rollback)."""
        if not self.create(obj):
            metadata = obj["metadata"]
            self.core.replace_namespaced_config_map(metadata["name"], metadata["namespace"], obj)

    def delete_pod(self, namespace: str, name: str, *, force: bool) -> None:
        body = client.V1DeleteOptions(grace_period_seconds=0 if force else None)
        try:
            self.core.delete_namespaced_pod(name, namespace, body=body)
        except ApiException as error:
            if error.status != HTTPStatus.NOT_FOUND:
                raise

    def list_pods(self, namespace: str, selector: str) -> list[Json]:
        """Pods matching a label selector, as plain camelCase JSON (what kubectl shows)."""
        listed = self.core.list_namespaced_pod(namespace, label_selector=selector)
        return [self.core.api_client.sanitize_for_serialization(pod) for pod in listed.items]

    def schedulable_nodes(self) -> list[str] | None:
        """Names of the Ready, schedulable nodes; None when the operator may not list nodes
        (a namespaced release has no cluster-wide permission)."""
        try:
            listed = self.core.list_node()
        except ApiException as error:
            if error.status in (HTTPStatus.FORBIDDEN, HTTPStatus.UNAUTHORIZED):
                return None
            raise
        names = []
        for node in listed.items:
            ready = any(
                c.type == "Ready" and c.status == "True" for c in (node.status.conditions or [])
            )
            if ready and not (node.spec and node.spec.unschedulable):
                names.append(str(node.metadata.name))
        return names

    def node_taints(self, name: str) -> tuple[list[Json], str] | None:
        """The node's taints as JSON and the resourceVersion they were read at; None when
        the node is gone."""
        try:
            node = self.core.read_node(name)
        except ApiException as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return None
            raise
        taints: list[Json] = self.core.api_client.sanitize_for_serialization(node.spec.taints or [])
        return taints, node.metadata.resource_version

    def patch_node(self, name: str, patch: Json) -> None:
        self.core.patch_node(name, patch)

    def get_job(self, namespace: str, name: str) -> Json | None:
        try:
            job: Json = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name
            )
        except ApiException as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return None
            raise
        return job

    def list_policies(self) -> list[Json]:
        """Every StableTrainingPolicy (cluster-scoped) as plain JSON."""
        listed: Json = self.custom.list_cluster_custom_object(GROUP, VERSION, POLICY_PLURAL)
        return list(listed.get("items") or [])

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        """A namespace's labels (what StableTrainingPolicy selectors match); None when gone."""
        try:
            namespace = self.core.read_namespace(name)
        except ApiException as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return None
            raise
        return dict(namespace.metadata.labels or {})

    def write_status(self, namespace: str, name: str, resource_version: str, status: Json) -> Json:
        """Replace the status as a merge patch (nulls remove fields), fenced by version."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            written: Json = self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, body, _content_type=MERGE_PATCH
            )
        except ApiException as error:
            if error.status == HTTPStatus.CONFLICT:
                raise StaleStatusError(f"{namespace}/{name} changed since it was read") from None
            raise
        return written

    def config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            found = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return None
            raise
        return dict(found.data or {})

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        try:
            found = self.core.read_namespaced_secret(name, namespace)
        except ApiException as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return None
            raise
        raw = (found.data or {}).get(key)
        return base64.b64decode(raw).decode() if raw else None

    def event(self, job: Json, kind: str, reason: str, message: str) -> None:
        """A core/v1 Event on the job; failures are logged, never fatal (status is the record)."""
        metadata = job["metadata"]
        now = datetime.now(UTC)
        body = {
            "metadata": {
                "generateName": f"{metadata['name']}.",
                "namespace": metadata["namespace"],
            },
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "uid": metadata["uid"],
                "resourceVersion": metadata.get("resourceVersion"),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
            "source": {"component": "stabletrain-operator"},
            "reportingComponent": "stabletrain.dev/operator",
            "reportingInstance": "stabletrain-operator",
        }
        try:
            self.core.create_namespaced_event(metadata["namespace"], body)
        except ApiException as error:
            _log.warning("event %s on %s not posted: %s", reason, metadata["name"], error.reason)
