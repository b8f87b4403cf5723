"""The Kueue API calls of a queued job's reconcile, synchronous (run in a worker thread).

The Workload is created idempotently by name (409: an interrupted tick made it); its status
and finalizers are written as merge patches fenced by the resourceVersion they were computed
from (409: Kueue changed it meanwhile, and the next tick computes them again).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.apiserver import ApiError, ApiServer, Resource
from stabletrain_operator.queue.workload import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    PRIORITY_CLASS_LABEL,
    RESOURCE_FLAVORS,
    WORKLOAD_PRIORITY_CLASSES,
    WORKLOADS,
    Priority,
)

Json = dict[str, Any]


def _kueue(plural: str, *verbs: str, **where: Any) -> Resource:
    return Resource(KUEUE_GROUP, KUEUE_VERSION, plural, frozenset(verbs), custom=True, **where)


WORKLOAD_OBJECTS = _kueue(WORKLOADS, "create", "patch")
WORKLOAD_STATUS = _kueue(WORKLOADS, "patch", subresource="status")
FLAVORS = _kueue(RESOURCE_FLAVORS, "get", namespaced=False)
WORKLOAD_PRIORITIES = _kueue(WORKLOAD_PRIORITY_CLASSES, "get", namespaced=False)
PRIORITY_CLASSES = Resource(
    "scheduling.k8s.io", "v1", "priorityclasses", frozenset({"get", "list"}), namespaced=False
)
KUEUE_RESOURCES = (WORKLOAD_OBJECTS, WORKLOAD_STATUS, FLAVORS, WORKLOAD_PRIORITIES,
                   PRIORITY_CLASSES)  # fmt: skip
"""What only the Kueue integration reads or writes (kube.RESOURCES has the rest)."""

_log = logging.getLogger(__name__)


class KueueApi:
    def __init__(self, api: ApiServer) -> None:
        self.api = api

    def create_workload(self, body: Json) -> bool:
        """False when it already existed."""
        namespace = body["metadata"]["namespace"]
        try:
            self.api.call("create", WORKLOAD_OBJECTS, namespace=namespace, body=body)
        except ApiError as error:
            if error.status == HTTPStatus.CONFLICT:
                return False
            raise
        return True

    def patch_workload_status(self, namespace: str, name: str, patch: Json) -> bool:
        """False when the Workload changed since the patch was computed, or is gone."""
        try:
            self.api.call("patch", WORKLOAD_STATUS, namespace=namespace, name=name, body=patch)
        except ApiError as error:
            if error.status in (HTTPStatus.CONFLICT, HTTPStatus.NOT_FOUND):
                return False
            raise
        return True

    def patch_workload(self, namespace: str, name: str, patch: Json) -> bool:
        """Metadata (the finalizers); False on a conflict or when it is gone."""
        try:
            self.api.call("patch", WORKLOAD_OBJECTS, namespace=namespace, name=name, body=patch)
        except ApiError as error:
            if error.status in (HTTPStatus.CONFLICT, HTTPStatus.NOT_FOUND):
                return False
            raise
        return True

    def flavor(self, name: str) -> Json | None:
        try:
            found = self.api.call("get", FLAVORS, name=name)
        except ApiError as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return None
            raise
        return found

    def priority(self, labels: dict[str, str], spec: StableTrainingJobSpec) -> Priority:
        """The job's priority as Kueue's ExtractPriority finds it: the WorkloadPriorityClass
        its kueue.x-k8s.io/priority-class label names, else the PriorityClass of its pod
        template, else the cluster's global default PriorityClass (the lowest when there are
        several), else 0."""
        workload_class = labels.get(PRIORITY_CLASS_LABEL)
        if workload_class:
            found = self.api.call("get", WORKLOAD_PRIORITIES, name=workload_class)
            return Priority(int(found["value"]), "WorkloadPriorityClass", workload_class)
        pod_class = (spec.workers.template.get("spec") or {}).get("priorityClassName")
        if pod_class:
            read = self.api.call("get", PRIORITY_CLASSES, name=pod_class)
            return Priority(int(read["value"]), "PriorityClass", pod_class)
        listed = self.api.call("list", PRIORITY_CLASSES).get("items") or []
        defaults = [c for c in listed if c.get("globalDefault")]
        if defaults:
            lowest = min(defaults, key=lambda c: int(c["value"]))
            return Priority(int(lowest["value"]), "PriorityClass", str(lowest["metadata"]["name"]))
        return Priority(0)
