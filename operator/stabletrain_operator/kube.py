"""The few Kubernetes API calls the reconcile makes, synchronous (run in a worker thread).

Creates treat 409 as success when the object there is controlled by the same job (names
are deterministic: it is the one an earlier, interrupted tick made) and raise
ownership.NotOwnedError otherwise; reads of a job's ConfigMaps and Secret return nothing
from an object the job does not control. Deletes treat 404 as success, and the status write
carries the resourceVersion the tick read, so a write based on a stale read fails with 409
instead of overwriting a newer state (which matters with several operator replicas).
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
from stabletrain_operator.ownership import NotOwnedError, controller, controller_uid

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
        self.networking: Any = client.NetworkingV1Api(api_client)

    def _calls(self, kind: str) -> tuple[Any, Any, Any]:
        """(create, read, replace) of a kind the operator makes for its jobs."""
        core, networking = self.core, self.networking
        return {
            "Pod": (core.create_namespaced_pod, core.read_namespaced_pod, None),
            "Service": (core.create_namespaced_service, core.read_namespaced_service, None),
            "ConfigMap": (core.create_namespaced_config_map, core.read_namespaced_config_map,
                          core.replace_namespaced_config_map),
            "Secret": (core.create_namespaced_secret, core.read_namespaced_secret, None),
            "NetworkPolicy": (networking.create_namespaced_network_policy,
                              networking.read_namespaced_network_policy,
                              networking.replace_namespaced_network_policy),
        }[kind]  # fmt: skip

    def _existing(self, obj: Json) -> Json:
        """The object of `obj`'s kind and name that is there, as JSON, if `obj`'s controller
        controls it; NotOwnedError otherwise."""
        metadata = obj["metadata"]
        _, read, _ = self._calls(obj["kind"])
        found = self.core.api_client.sanitize_for_serialization(
            read(metadata["name"], metadata["namespace"])
        )
        theirs = controller(found.get("metadata") or {})
        ours = controller_uid(metadata)
        if theirs is None or theirs.get("uid") != ours:
            job = (controller(metadata) or {}).get("name", "")
            raise NotOwnedError(obj["kind"], metadata["name"], metadata["namespace"], theirs, job)
        existing: Json = found
        return existing

    def create(self, obj: Json) -> bool:
        """Create `obj` in its namespace; False when its own controller's object of that name
        already existed; NotOwnedError when somebody else's does."""
        create, _, _ = self._calls(obj["kind"])
        try:
            create(obj["metadata"]["namespace"], obj)
        except ApiException as error:
            if error.status == HTTPStatus.CONFLICT:
                self._existing(obj)
                return False
            raise
        return True

    def create_or_update(self, obj: Json, compared: str) -> None:
        """Create `obj`, or replace the controller's own object of that name when its
        `compared` part (e.g. "spec") differs (the skip-list spill grows with every rollback;
        a NetworkPolicy follows the operator's settings)."""
        create, _, replace = self._calls(obj["kind"])
        try:
            create(obj["metadata"]["namespace"], obj)
            return
        except ApiException as error:
            if error.status != HTTPStatus.CONFLICT:
                raise
        existing = self._existing(obj)
        if existing.get(compared) != obj.get(compared):
            metadata = {
                **obj["metadata"],
                "resourceVersion": existing["metadata"]["resourceVersion"],
            }
            replace(metadata["name"], metadata["namespace"], {**obj, "metadata": metadata})

    def dry_run_create(self, obj: Json) -> ApiException | None:
        """The API server's verdict on creating `obj`, without creating it (validation and
        admission run, nothing is stored): None when it would be created."""
        create, _, _ = self._calls(obj["kind"])
        try:
            create(obj["metadata"]["namespace"], obj, dry_run="All")
        except ApiException as error:
            if error.status == HTTPStatus.CONFLICT:
                return None
            return error
        return None

    def delete_pod(self, namespace: str, name: str, *, force: bool) -> None:
        body = client.V1DeleteOptions(grace_period_seconds=0 if force else None)
        try:
            self.core.delete_namespaced_pod(name, namespace, body=body)
        except ApiException as error:
            if error.status != HTTPStatus.NOT_FOUND:
                raise

    def label_pod(self, namespace: str, name: str, labels: Json) -> bool:
        """Merge `labels` into a pod's; False when the pod is gone."""
        try:
            self.core.patch_namespaced_pod(name, namespace, {"metadata": {"labels": labels}})
        except ApiException as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return False
            raise
        return True

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

    def _owned(self, kind: str, namespace: str, name: str, owner_uid: str) -> Json | None:
        """The object as JSON when it exists and the job `owner_uid` controls it; one that
        another owner controls is logged and read as absent."""
        _, read, _ = self._calls(kind)
        try:
            found: Json = self.core.api_client.sanitize_for_serialization(read(name, namespace))
        except ApiException as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return None
            raise
        if controller_uid(found.get("metadata") or {}) != owner_uid:
            _log.warning("%s %s/%s is not the job's (its controller is not uid %s); not read",
                         kind, namespace, name, owner_uid)  # fmt: skip
            return None
        return found

    def config_map_data(self, namespace: str, name: str, owner_uid: str) -> dict[str, str] | None:
        found = self._owned("ConfigMap", namespace, name, owner_uid)
        return None if found is None else dict(found.get("data") or {})

    def secret_value(self, namespace: str, name: str, key: str, owner_uid: str) -> str | None:
        return (self.secret_data(namespace, name, owner_uid) or {}).get(key)

    def secret_data(self, namespace: str, name: str, owner_uid: str) -> dict[str, str] | None:
        """Every non-empty value of the job's Secret, decoded; None when there is no such
        Secret, or it is not the job's."""
        found = self._owned("Secret", namespace, name, owner_uid)
        if found is None:
            return None
        return {
            key: base64.b64decode(raw).decode()
            for key, raw in (found.get("data") or {}).items()
            if raw
        }

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
