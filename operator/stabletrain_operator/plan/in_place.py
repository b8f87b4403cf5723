"""Which pods of a stopped attempt are restarted in place and which are replaced.

Recovery cost must not grow with the job: a pod is a node's allocation, not an attempt.
Under `recovery.restart: InPlace` a recovery keeps every pod that can run the next attempt
as it is and replaces only those that must go. A pod must go when its container no longer
runs (evicted, OOM-killed, the supervisor itself gone), its node stopped reporting or is a
suspect the relaunch avoids, it was built from another shape of the spec (the next attempt
would run an outdated template), its processes would not die, or they did not stop within
the grace period the stop gave them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from stabletrain_contract.supervisor import ENDED_STATES, ProcessState, SupervisorReport
from stabletrain_operator.api.status import RollbackRecord, SuspectNode
from stabletrain_operator.observe.pod_facts import PodFacts

REPEATED_INCIDENTS = 2
"""A suspect node's pods are kept (restarted in place) at its first incident and replaced
from this one on. Evidence that condemns a node by itself (the node lost or silent, the pod
evicted or OOM-killed) already ended its pod's container, which is never kept; what is left
is a process killed on a node that still runs: once is the process's bad luck (an OOM kill,
a person), twice within `placement.suspectSeconds` is the node's."""


@dataclass(frozen=True)
class Split:
    kept: tuple[PodFacts, ...]
    """Pods whose processes stop (or stopped) and which run the next attempt."""
    replaced: tuple[PodFacts, ...]
    """Every other pod of the job: deleted, the next attempt creates their ranks anew."""


def keepable(
    pod: PodFacts, attempts: Collection[int], *, shape: str, avoided: Collection[str]
) -> str | None:
    """Why `pod` cannot be restarted in place (None: it can). `attempts`: the attempt being
    stopped, and during the relaunch also the next one (a kept pod is relabelled first)."""
    if pod.attempt not in attempts:
        return f"it belongs to attempt {pod.attempt}"
    if not pod.supervised:
        return "its command does not run under the supervisor"
    if pod.deleting or not pod.container_running:
        return "its container no longer runs"
    if pod.node_silent:
        return f"its node {pod.node} stopped reporting"
    if pod.node in avoided:
        return f"its node {pod.node} is a suspect of repeated incidents the relaunch avoids"
    if pod.shape != shape:
        return "the spec's workers, tiers, memory tier or warm start changed since it was created"
    return None


def split(
    pods: Sequence[PodFacts],
    attempts: Collection[int],
    *,
    shape: str,
    avoided: Collection[str],
    replaced_ranks: Collection[int] = (),
) -> Split:
    """The pods of the job, split for an in-place relaunch: one kept pod per rank at most,
    never one of a rank already marked replaced."""
    kept: dict[int, PodFacts] = {}
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.rank in replaced_ranks or pod.rank in kept:
            continue
        if keepable(pod, attempts, shape=shape, avoided=avoided) is None:
            kept[pod.rank] = pod
    chosen = {p.name for p in kept.values()}
    return Split(
        kept=tuple(kept[rank] for rank in sorted(kept)),
        replaced=tuple(p for p in pods if p.name not in chosen),
    )


def nodes_to_leave(suspects: Sequence[SuspectNode], avoided: Collection[str]) -> set[str]:
    """The avoided suspect nodes whose pods an in-place relaunch replaces: those with
    REPEATED_INCIDENTS or more of this job's incidents."""
    return {n.node for n in suspects if n.node in avoided and n.incidents >= REPEATED_INCIDENTS}


def repeat_leaves_the_node(
    culprits: Collection[str],
    history: Sequence[RollbackRecord],
    suspects: Sequence[SuspectNode],
    avoided: Collection[str],
) -> bool:
    """A failure that repeats the one before it, right after a relaunch that kept the pods
    in place, on culprit nodes already suspect: their second incident, after which the
    relaunch leaves them. Not a crash loop of the job (a relaunch that had left the nodes
    and met the same error would be one)."""
    if not culprits or not history or history[-1].restarted_in_place == 0:
        return False
    known = {n.node: n.incidents for n in suspects if n.node in avoided}
    return all(known.get(node, 0) + 1 >= REPEATED_INCIDENTS for node in culprits)


def stopped(report: SupervisorReport | None, attempt: int) -> bool:
    """The supervisor reports no process left of `attempt` (nor of an older one it ran)."""
    return report is not None and report.attempt <= attempt and report.state in ENDED_STATES


def must_replace(
    pod: PodFacts, report: SupervisorReport | None, attempt: int, *, overdue: bool
) -> str | None:
    """Why a kept pod must be replaced after all while its stop is under way."""
    if not pod.container_running or pod.deleting:
        return f"pod {pod.name}'s container ended during the stop"
    if report is not None and report.state is ProcessState.UNKILLABLE:
        left = ", ".join(str(pid) for pid in report.leftover_pids)
        return f"pod {pod.name}'s processes survived KILL ({left})"
    if overdue and not stopped(report, attempt):
        return f"pod {pod.name}'s processes did not stop within the grace period"
    return None


def lagging_starts(
    pods: Sequence[PodFacts], reports: Mapping[str, SupervisorReport], attempt: int
) -> tuple[str, ...]:
    """Supervised pods of `attempt` whose supervisor still reports an older attempt ended:
    their start order did not arrive, and is sent again (it is idempotent)."""
    return tuple(
        sorted(
            pod.name
            for pod in pods
            if pod.attempt == attempt
            and pod.supervised
            and pod.container_running
            and stopped(reports.get(pod.name), attempt - 1)
        )
    )
