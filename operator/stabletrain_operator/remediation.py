"""Optional: take a node out of scheduling once several jobs lost their pods to it.

Off unless the operator runs with `--remediate-nodes ACTION:N` (the chart's
`nodeRemediation` values, with their own ClusterRole for `nodes` get/patch). A taint or a
cordon affects every tenant's pods, so one tenant must not be able to steer it:

- Only evidence the tenant cannot forge counts: the node stopped reporting and the node
  controller marked the job's pod not ready (observe/pod_facts.py, `node_silent`; it needs the
  right to write pods' status, which is the kubelet's and the controllers'). A pod's exit
  code, its OOM kill (its own memory limit) and the `exitcode: -N` of its termination
  message are the job's to cause or to write: they steer the job's own placement (its
  suspect list), never remediation.
- A node is due once such incidents come from at least `--remediate-min-jobs` different
  jobs (default 2) and number N in all, within each job's suspect window. One job's
  incidents never suffice by default: a tenant may run jobs that break any node they land
  on. `--remediate-min-jobs 1` is for clusters where one team owns every job.

Taint adds `stabletrain.dev/suspect=NodeLost:NoSchedule` (a constant value: a job's name
cut to a label's 63 characters could end in `-` or `.`, which the API server refuses), so
nothing new lands there that does not tolerate it; Cordon sets `spec.unschedulable`. Either
way the node gets the annotation `stabletrain.dev/suspect-reason` with the jobs, the count
and the evidence. Nothing is removed automatically: uncordoning or untainting a repaired
node is a person's decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from stabletrain_operator.api.constants import GROUP
from stabletrain_operator.api.status import SuspectNode

TAINT_KEY = f"{GROUP}/suspect"
TAINT_VALUE = "NodeLost"
REASON_ANNOTATION = f"{GROUP}/suspect-reason"
DEFAULT_MIN_JOBS = 2


class NodeAction(StrEnum):
    TAINT = "Taint"
    CORDON = "Cordon"


@dataclass(frozen=True)
class NodeRemediation:
    action: NodeAction
    incidents: int
    """Node-lost incidents on the node, of all jobs together, before it is taken out."""
    jobs: int = DEFAULT_MIN_JOBS
    """Different jobs those incidents must come from."""

    @classmethod
    def parse(cls, text: str) -> NodeRemediation:
        """`Taint:3` or `Cordon:2`; ValueError names what is wrong."""
        action, _, count = text.partition(":")
        if action not in tuple(NodeAction) or not count.isdigit() or int(count) < 1:
            raise ValueError(
                f"--remediate-nodes must be Taint:N or Cordon:N with N >= 1, got {text!r}"
            )
        return cls(NodeAction(action), int(count))


@dataclass(frozen=True)
class NodeVerdict:
    """A node due for remediation and the evidence."""

    node: str
    jobs: tuple[str, ...]
    """`<namespace>/<job>` of every job whose pods the node lost."""
    incidents: int
    last_reason: str


class NodeVotes:
    """Node-lost incidents per node and job, across every job this operator serves (each
    job's daemon records its suspect list when it changes)."""

    def __init__(self) -> None:
        self._by_job: dict[str, dict[str, SuspectNode]] = {}

    def record(self, job: str, nodes: Sequence[SuspectNode]) -> set[str]:
        """Replace the job's entries; the nodes whose node-lost count for it grew."""
        before = self._by_job.get(job, {})
        after = {n.node: n for n in nodes if n.node_lost_incidents > 0}
        self._by_job[job] = after
        return {
            name
            for name, node in after.items()
            if name not in before or node.node_lost_incidents > before[name].node_lost_incidents
        }

    def forget(self, job: str) -> None:
        self._by_job.pop(job, None)

    def due(self, rule: NodeRemediation, nodes: set[str], now: datetime) -> list[NodeVerdict]:
        """Those of `nodes` whose unexpired node-lost incidents come from enough jobs and
        reach the count."""
        verdicts = []
        for name in sorted(nodes):
            entries = [
                (job, by_node[name])
                for job, by_node in sorted(self._by_job.items())
                if name in by_node and by_node[name].expires_at > now
            ]
            incidents = sum(node.node_lost_incidents for _, node in entries)
            if len(entries) < rule.jobs or incidents < rule.incidents:
                continue
            newest = max(entries, key=lambda entry: entry[1].last_incident_at)[1]
            jobs = tuple(job for job, _ in entries)
            verdicts.append(NodeVerdict(name, jobs, incidents, newest.last_reason))
        return verdicts


def node_patch(
    verdict: NodeVerdict,
    existing_taints: Sequence[dict[str, Any]],
    action: NodeAction,
    resource_version: str,
) -> dict[str, Any]:
    """The strategic-merge patch of the node: the annotation, and the taint or the cordon.

    The taint patch replaces the whole list (a node's taints merge as one atomic list), so
    it carries the resourceVersion the list was read at: a taint another controller added
    or removed since (the node lifecycle's not-ready one) makes the API server refuse it
    with 409 instead of being undone, and the caller reads again.
    """
    reason = (
        f"lost the pods of {len(verdict.jobs)} job(s) ({', '.join(verdict.jobs)}) "
        f"{verdict.incidents} time(s): {verdict.last_reason}"
    )[:1024]
    patch: dict[str, Any] = {"metadata": {"annotations": {REASON_ANNOTATION: reason}}}
    if action is NodeAction.CORDON:
        patch["spec"] = {"unschedulable": True}
        return patch
    taints = [t for t in existing_taints if t.get("key") != TAINT_KEY]
    taints.append({"key": TAINT_KEY, "value": TAINT_VALUE, "effect": "NoSchedule"})
    patch["metadata"]["resourceVersion"] = resource_version
    patch["spec"] = {"taints": taints}
    return patch


def tainted(taints: Sequence[dict[str, Any]]) -> bool:
    """Whether the node already carries the remediation's taint (a person removes it)."""
    return any(t.get("key") == TAINT_KEY for t in taints)
