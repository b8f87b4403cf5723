"""The Kueue API calls of a queued job's reconcile, synchronous (run in a worker thread).

The Workload is created idempotently by name (409: an interrupted tick made it); its status
and finalizers are written as merge patches fenced by the resourceVersion they were computed
from (409: Kueue changed it meanwhile, and the next tick computes them again).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stabletrain_operator.api.spec import StableTrainingJobSpec
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
MERGE_PATCH = "application/merge-patch+json"

_log = logging.getLogger(__name__)


class KueueApi:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.scheduling: Any = client.SchedulingV1Api(api_client)

    def create_workload(self, body: Json) -> bool:
        """False when it already existed."""
        namespace = body["metadata"]["namespace"]
        try:
            self.custom.create_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOADS, body
            )
        except ApiException as error:
            if error.status == HTTPStatus.CONFLICT:
                return False
            raise
        return True

    def patch_workload_status(self, namespace: str, name: str, patch: Json) -> bool:
        """False when the Workload changed since the patch was computed, or is gone."""
        try:
            self.custom.patch_namespaced_custom_object_status(
                KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOADS, name, patch,
                _content_type=MERGE_PATCH,
            )  # fmt: skip
        except ApiException as error:
            if error.status in (HTTPStatus.CONFLICT, HTTPStatus.NOT_FOUND):
                return False
            raise
        return True

    def patch_workload(self, namespace: str, name: str, patch: Json) -> bool:
        """Metadata (the finalizers); False on a conflict or when it is gone."""
        try:
            self.custom.patch_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, WORKLOADS, name, patch,
                _content_type=MERGE_PATCH,
            )  # fmt: skip
        except ApiException as error:
            if error.status in (HTTPStatus.CONFLICT, HTTPStatus.NOT_FOUND):
                return False
            raise
        return True

    def flavor(self, name: str) -> Json | None:
        try:
            found: Json = self.custom.get_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, RESOURCE_FLAVORS, name
            )
        except ApiException as error:
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
            found = self.custom.get_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PRIORITY_CLASSES, workload_class
            )
            return Priority(int(found["value"]), "WorkloadPriorityClass", workload_class)
        pod_class = (spec.workers.template.get("spec") or {}).get("priorityClassName")
        if pod_class:
            read = self.scheduling.read_priority_class(pod_class)
            return Priority(int(read.value), "PriorityClass", pod_class)
        defaults = [c for c in self.scheduling.list_priority_class().items if c.global_default]
        if defaults:
            lowest = min(defaults, key=lambda c: c.value)
            return Priority(int(lowest.value), "PriorityClass", str(lowest.metadata.name))
        return Priority(0)
