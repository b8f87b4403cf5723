"""The scheduler's side effects: bind pending pods, or say on the pod why none fits.

The choice itself is scheduler.py's; this module only writes: a Binding (the subresource
kube-scheduler uses) or a PodScheduled=False condition with the reason, once per reason.
"""

from __future__ import annotations

import contextlib
import logging

from support.localnode.api import ApiError, Json, RawApi, pod_path
from support.localnode.scheduler import choose_node
from support.localnode.status import TERMINAL_PHASES

log = logging.getLogger(__name__)


class Binder:
    def __init__(self, api: RawApi) -> None:
        self.api = api
        self._unschedulable: dict[str, str] = {}

    def schedule(self, pods: list[Json], nodes: list[Json]) -> None:
        """Binds every pending pod that fits one of `nodes`; says why for those that do not."""
        per_node: dict[str, int] = {}
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if node and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES:
                per_node[node] = per_node.get(node, 0) + 1
        for pod in pods:
            spec, metadata = pod["spec"], pod["metadata"]
            wants_us = spec.get("schedulerName", "default-scheduler") == "default-scheduler"
            if spec.get("nodeName") or metadata.get("deletionTimestamp") or not wants_us:
                continue
            chosen, why = choose_node(pod, nodes, per_node)
            if chosen is None:
                self._report_unschedulable(pod, why)
                continue
            self._bind(pod, chosen)
            per_node[chosen] = per_node.get(chosen, 0) + 1

    def _bind(self, pod: Json, node: str) -> None:
        metadata = pod["metadata"]
        binding = {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": metadata["name"], "uid": metadata["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }  # fmt: skip
        try:
            self.api.post(pod_path(metadata["namespace"], metadata["name"]) + "/binding", binding)
        except ApiError as error:
            log.warning("binding %s to %s failed: %s", metadata["name"], node, error)
        self._unschedulable.pop(metadata["uid"], None)

    def _report_unschedulable(self, pod: Json, why: str) -> None:
        metadata = pod["metadata"]
        if self._unschedulable.get(metadata["uid"]) == why:
            return
        self._unschedulable[metadata["uid"]] = why
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": why}  # fmt: skip
        with contextlib.suppress(ApiError):
            self.api.request(
                "PATCH",
                pod_path(metadata["namespace"], metadata["name"]) + "/status",
                {"status": {"conditions": [condition]}},
                content_type="application/strategic-merge-patch+json",
            )
