"""Optional: take a node out of scheduling once it was the culprit of N incidents of a job.

Off unless the operator runs with `--remediate-nodes ACTION:N` (the chart's
`nodeRemediation` values, with their own ClusterRole for `nodes` get/patch). Taint adds
`stabletrain.dev/suspect=<namespace>.<job>:NoSchedule`, so nothing new lands there that
does not tolerate it; Cordon sets `spec.unschedulable`. Either way the node gets the
annotation `stabletrain.dev/suspect-reason` with the job, the count and the evidence, so a
person sees why. Nothing is ever removed automatically: uncordoning or untainting a
repaired node is a person's decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from stabletrain_operator.api.constants import GROUP
from stabletrain_operator.api.status import SuspectNode

TAINT_KEY = f"{GROUP}/suspect"
REASON_ANNOTATION = f"{GROUP}/suspect-reason"


class NodeAction(StrEnum):
    TAINT = "Taint"
    CORDON = "Cordon"


@dataclass(frozen=True)
class NodeRemediation:
    action: NodeAction
    incidents: int
    """Incidents of one job on the node before it is taken out of scheduling."""

    @classmethod
    def parse(cls, text: str) -> NodeRemediation:
        """`Taint:3` or `Cordon:2`; ValueError names what is wrong."""
        action, _, count = text.partition(":")
        if action not in tuple(NodeAction) or not count.isdigit() or int(count) < 1:
            raise ValueError(
                f"--remediate-nodes must be Taint:N or Cordon:N with N >= 1, got {text!r}"
            )
        return cls(NodeAction(action), int(count))


def due(
    before: Sequence[SuspectNode], after: Sequence[SuspectNode], remediation: NodeRemediation
) -> list[SuspectNode]:
    """Suspect nodes whose incident count reached the threshold in this step."""
    seen = {n.node: n.incidents for n in before}
    return [
        n
        for n in after
        if n.incidents >= remediation.incidents and seen.get(n.node, 0) < n.incidents
    ]


def node_patch(
    node: SuspectNode,
    existing_taints: Sequence[dict[str, Any]],
    action: NodeAction,
    job: str,
    resource_version: str,
) -> dict[str, Any]:
    """The strategic-merge patch of the node: the annotation, and the taint or the cordon.

    The taint patch replaces the whole list (a node's taints merge as one atomic list), so
    it carries the resourceVersion the list was read at: a taint another controller added
    or removed since (the node lifecycle's not-ready one) makes the API server refuse it
    with 409 instead of being undone, and the caller reads again.
    """
    reason = f"{job}: culprit of {node.incidents} incident(s): {node.last_reason}"[:1024]
    patch: dict[str, Any] = {"metadata": {"annotations": {REASON_ANNOTATION: reason}}}
    if action is NodeAction.CORDON:
        patch["spec"] = {"unschedulable": True}
        return patch
    taints = [t for t in existing_taints if t.get("key") != TAINT_KEY]
    taints.append({"key": TAINT_KEY, "value": job.replace("/", ".")[:63], "effect": "NoSchedule"})
    patch["metadata"]["resourceVersion"] = resource_version
    patch["spec"] = {"taints": taints}
    return patch
