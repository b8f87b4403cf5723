"""A queued job's admission as the state machine sees it, and where admitted pods go.

Kueue admits a Workload into ResourceFlavors; a flavor's `nodeLabels` and `tolerations` are
where the quota it reserved lives. Kueue's built-in integrations inject them into the job's
pod template when they start it (jobframework's RunWithPodSetsInfo, podset.FromAssignment);
the operator puts them on every pod it creates while admitted: the first attempt and every
relaunch after a rollback, a restart or a move away from a suspect node, so a relaunch
stays inside the admitted flavor whatever else its placement avoids.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stabletrain_operator.queue.facts import Eviction, WorkloadFacts

Json = dict[str, Any]


@dataclass(frozen=True)
class Placement:
    """The admitted flavors' node labels (as a node selector) and tolerations."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()

    def apply(self, pod_spec: Json) -> None:
        """Into a pod spec: the flavors' labels join its node selector (the flavor's value
        where both name a key: Kueue only admits into a flavor the selector allows) and their
        tolerations are added unless the pod already has the same one."""
        if self.node_selector:
            pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}),
                                        **dict(self.node_selector)}  # fmt: skip
        tolerations = list(pod_spec.get("tolerations") or [])
        for toleration in self.tolerations:
            if toleration not in tolerations:
                tolerations.append(copy.deepcopy(dict(toleration)))
        if tolerations:
            pod_spec["tolerations"] = tolerations


def placement_of(flavors: Sequence[Mapping[str, Any]]) -> Placement:
    """The placement of an admission into these ResourceFlavor objects."""
    labels: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for flavor in flavors:
        spec = flavor.get("spec") or {}
        labels.update({str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()})
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
    return Placement(tuple(sorted(labels.items())), tuple(tolerations))


@dataclass(frozen=True)
class Admission:
    """Where a queued job stands with Kueue (World.admission; None for a job not queued)."""

    local_queue: str
    workload: str = ""
    """The Workload's name, empty until it exists."""
    admitted: bool = False
    finished: bool = False
    eviction: Eviction | None = None
    cluster_queue: str | None = None
    waiting: str = ""
    """Kueue's message on why it is not admitted."""
    placement: Placement = field(default_factory=Placement)

    @property
    def may_run(self) -> bool:
        """Pods may exist: admitted, and Kueue wants nothing back."""
        return self.admitted and self.eviction is None and not self.finished


def admission_of(
    local_queue: str,
    workload: str,
    facts: WorkloadFacts | None,
    placement: Placement | None = None,
) -> Admission:
    """The admission of the Workload named `workload`, seen as `facts` (None: not created
    yet, or not seen by the operator's watch yet)."""
    if facts is None:
        return Admission(local_queue, workload)
    eviction = facts.eviction
    if facts.deleting and eviction is None:
        # jobframework stops a job whose Workload is being deleted; a new one is made after.
        eviction = Eviction("WorkloadDeleted", f"Workload {facts.name} is being deleted")
    return Admission(
        local_queue=local_queue,
        workload=facts.name,
        admitted=facts.admitted,
        finished=facts.finished,
        eviction=eviction,
        cluster_queue=facts.cluster_queue,
        waiting=facts.waiting,
        placement=placement or Placement(),
    )
