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

from stabletrain_operator.api.cluster_policy import POLICY_PLURAL
from stabletrain_operator.api.constants import API_VERSION, GROUP, KIND, PLURAL, VERSION
from stabletrain_operator.apiserver import ApiError, ApiServer, Resource
from stabletrain_operator.ownership import NotOwnedError, controller, controller_uid

Json = dict[str, Any]
T = TypeVar("T")

_log = logging.getLogger(__name__)


FANOUT = 8
"""Requests of one launch or one stop in flight at once. One after another, a 256-pod job
took 60 s to stop and 65 s to relaunch on the local control plane (bench/operator_scale.py
--big-job 256)."""


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


def _resource(group: str, plural: str, *verbs: str, **where: Any) -> Resource:
    version = VERSION if group == GROUP else "v1"
    return Resource(group, version, plural, frozenset(verbs), **where)


PODS = _resource("", "pods", "create", "get", "list", "delete", "patch")
SERVICES = _resource("", "services", "create", "get")
CONFIG_MAPS = _resource("", "configmaps", "create", "get", "update")
SECRETS = _resource("", "secrets", "create", "get")
EVENTS = _resource("", "events", "create")
NETWORK_POLICIES = _resource("networking.k8s.io", "networkpolicies", "create", "get", "update")
NODES = _resource("", "nodes", "list", "get", "patch", namespaced=False)
NAMESPACES = _resource("", "namespaces", "get", namespaced=False)
JOBS = _resource(GROUP, PLURAL, "get", custom=True)
JOB_STATUS = _resource(GROUP, PLURAL, "patch", subresource="status", custom=True)
POLICIES = _resource(GROUP, POLICY_PLURAL, "list", namespaced=False, custom=True)
RESOURCES = (PODS, SERVICES, CONFIG_MAPS, SECRETS, EVENTS, NETWORK_POLICIES, NODES, NAMESPACES,
             JOBS, JOB_STATUS, POLICIES)  # fmt: skip
"""Everything the reconcile reads or writes (the Kueue integration adds queue/api.py's)."""
KINDS = {
    "Pod": PODS,
    "Service": SERVICES,
    "ConfigMap": CONFIG_MAPS,
    "Secret": SECRETS,
    "NetworkPolicy": NETWORK_POLICIES,
}
"""The kinds the operator makes for its jobs, by the `kind` of the object it builds."""


class Kube:
    def __init__(self, api: ApiServer) -> None:
        self.api = api

    def _existing(self, obj: Json) -> Json:
        """The object of `obj`'s kind and name that is there, as JSON, if `obj`'s controller
        controls it; NotOwnedError otherwise."""
        metadata = obj["metadata"]
        found = self.api.call(
            "get", KINDS[obj["kind"]], namespace=metadata["namespace"], name=metadata["name"]
        )
        theirs = controller(found.get("metadata") or {})
        ours = controller_uid(metadata)
        if theirs is None or theirs.get("uid") != ours:
            job = (controller(metadata) or {}).get("name", "")
            raise NotOwnedError(obj["kind"], metadata["name"], metadata["namespace"], theirs, job)
        return found

    def _create(self, obj: Json, query: dict[str, str] | None = None) -> None:
        namespace = obj["metadata"]["namespace"]
        self.api.call("create", KINDS[obj["kind"]], namespace=namespace, body=obj, query=query)

    def create(self, obj: Json) -> bool:
        """Create `obj` in its namespace; False when its own controller's object of that name
        already existed; NotOwnedError when somebody else's does."""
        try:
            self._create(obj)
        except ApiError as error:
            if error.status == HTTPStatus.CONFLICT:
                self._existing(obj)
                return False
            raise
        return True

    def create_or_update(self, obj: Json, compared: str) -> None:
        """Create `obj`, or replace the controller's own object of that name when its
        `compared` part (e.g. "spec") differs (the skip-list spill grows with every rollback;
        a NetworkPolicy follows the operator's settings)."""
        try:
            self._create(obj)
            return
        except ApiError as error:
            if error.status != HTTPStatus.CONFLICT:
                raise
        existing = self._existing(obj)
        if existing.get(compared) != obj.get(compared):
            metadata = {
                **obj["metadata"],
                "resourceVersion": existing["metadata"]["resourceVersion"],
            }
            self.api.call(
                "update", KINDS[obj["kind"]], namespace=metadata["namespace"],
                name=metadata["name"], body={**obj, "metadata": metadata},
            )  # fmt: skip

    def dry_run_create(self, obj: Json) -> ApiError | None:
        """The API server's verdict on creating `obj`, without creating it (validation and
        admission run, nothing is stored): None when it would be created."""
        try:
            self._create(obj, {"dryRun": "All"})
        except ApiError as error:
            if error.status == HTTPStatus.CONFLICT:
                return None
            return error
        return None

    def delete_pod(self, namespace: str, name: str, *, force: bool) -> None:
        options = {"gracePeriodSeconds": 0} if force else {}
        try:
            self.api.call("delete", PODS, namespace=namespace, name=name, body=options)
        except ApiError as error:
            if error.status != HTTPStatus.NOT_FOUND:
                raise

    def label_pod(self, namespace: str, name: str, labels: Json) -> bool:
        """Merge `labels` into a pod's; False when the pod is gone."""
        patch = {"metadata": {"labels": labels}}
        try:
            self.api.call("patch", PODS, namespace=namespace, name=name, body=patch)
        except ApiError as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return False
            raise
        return True

    def list_pods(self, namespace: str, selector: str) -> list[Json]:
        """Pods matching a label selector, as JSON (what kubectl shows)."""
        listed = self.api.call("list", PODS, namespace=namespace, query={"labelSelector": selector})
        return list(listed.get("items") or [])

    def schedulable_nodes(self) -> list[str] | None:
        """Names of the Ready, schedulable nodes; None when the operator may not list nodes
        (a namespaced release has no cluster-wide permission)."""
        try:
            listed = self.api.call("list", NODES)
        except ApiError as error:
            if error.status in (HTTPStatus.FORBIDDEN, HTTPStatus.UNAUTHORIZED):
                return None
            raise
        names = []
        for node in listed.get("items") or []:
            conditions = (node.get("status") or {}).get("conditions") or []
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
            if ready and not (node.get("spec") or {}).get("unschedulable"):
                names.append(str(node["metadata"]["name"]))
        return names

    def node_taints(self, name: str) -> tuple[list[Json], str] | None:
        """The node's taints as JSON and the resourceVersion they were read at; None when
        the node is gone."""
        try:
            node = self.api.call("get", NODES, name=name)
        except ApiError as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return None
            raise
        taints: list[Json] = (node.get("spec") or {}).get("taints") or []
        return taints, str(node["metadata"]["resourceVersion"])

    def patch_node(self, name: str, patch: Json) -> None:
        """A strategic-merge patch (remediation.node_patch)."""
        self.api.call("patch", NODES, name=name, body=patch)

    def get_job(self, namespace: str, name: str) -> Json | None:
        try:
            return self.api.call("get", JOBS, namespace=namespace, name=name)
        except ApiError as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return None
            raise

    def list_policies(self) -> list[Json]:
        """Every StableTrainingPolicy (cluster-scoped) as plain JSON."""
        listed = self.api.call("list", POLICIES)
        return list(listed.get("items") or [])

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        """A namespace's labels (what StableTrainingPolicy selectors match); None when gone."""
        try:
            namespace = self.api.call("get", NAMESPACES, name=name)
        except ApiError as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return None
            raise
        return dict((namespace.get("metadata") or {}).get("labels") or {})

    def write_status(self, namespace: str, name: str, resource_version: str, status: Json) -> Json:
        """Replace the status as a merge patch (nulls remove fields), fenced by version."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        try:
            return self.api.call("patch", JOB_STATUS, namespace=namespace, name=name, body=body)
        except ApiError as error:
            if error.status == HTTPStatus.CONFLICT:
                raise StaleStatusError(f"{namespace}/{name} changed since it was read") from None
            raise

    def _owned(self, kind: str, namespace: str, name: str, owner_uid: str) -> Json | None:
        """The object as JSON when it exists and the job `owner_uid` controls it; one that
        another owner controls is logged and read as absent."""
        try:
            found = self.api.call("get", KINDS[kind], namespace=namespace, name=name)
        except ApiError as error:
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
            self.api.call("create", EVENTS, namespace=metadata["namespace"], body=body)
        except ApiError as error:
            _log.warning("event %s on %s not posted: %s", reason, metadata["name"], error.reason)
