"""Who an incident is attributed to: the rank that stopped first and the node it ran on.

The rules, in the order the evidence is trusted:

* A stall: the ranks the heartbeats show the others waiting for (stall.py).
* Pods that ended without a trip report: a pod that was lost with its node (deleted or
  vanished before it finished), evicted or OOM-killed is a suspect on its own. Then a pod
  whose worker was killed by a signal (torchrun's `exitcode: -N`, or the container's exit
  code above 128) while the others only exited with an error: they ended because their
  peer vanished from the collective (the victims' and the culprit's torchrun may end in
  either order, and kubelets stamp `finishedAt` in whole seconds). Otherwise the pod that
  ended first is the culprit. While the pods that ended only exited with an error and
  others still run, the decision waits for those others (awaiting_peers): a rank whose peer
  was killed can end on the broken collective before the killed rank's pod is seen ended.
  A pod still alone when the wait is over is told apart from the others (certain). A pod
  still running whose agent answered earlier in the attempt and now no longer does ends
  the wait at once and is the culprit: its node was lost or its processes froze, and the
  others' collective broke on it. Seen in `make chaos`: a lost node's pod shows Running
  until the node controller marks it, so after the wait the victim, the only pod seen
  ended, was blamed, its healthy node avoided and its pod replaced instead of restarted.
* Trip reports (NonFinite, LossSpike, custom signals) are never a node's fault: the values
  are averaged across every rank before the agent judges them, so no rank is singled out,
  and a fault that reproduces after a relaunch on other nodes is the data or the model.
  The rollback's escalation handles that recurrence; placement is not changed by it.

The same reasoning tells a crash loop's cause apart (failure_side): the same error on
different nodes is the job's; failures that follow one node are the node's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta

from stabletrain_operator.api.status import FailureRecord, Suspect
from stabletrain_operator.observe.failure_cause import failure_cause
from stabletrain_operator.observe.pod_facts import PodFacts, PodState
from stabletrain_operator.observe.stall import StallVerdict

NODE_REASONS = frozenset({"OOMKilled", "Evicted", "NodeLost", "Vanished", "Preempted"})
"""Pod or container reasons that point at the node (or its resources) by themselves."""
_WORKER_EXIT = re.compile(r"exitcode\s*:\s*(-?\d+)")
PEERS_AWAITED = timedelta(seconds=5)
"""How long pods that only exited with an error wait for the attempt's pods still running
before the failure is attributed. The victims of a killed rank fail on the broken
collective at once, while the killed worker's torchrun may take seconds to tear its
rendezvous down and end: deciding on the first pod seen ended avoided a victim's node (CI,
the bad-node e2e test)."""


def stall_suspects(verdict: StallVerdict) -> tuple[Suspect, ...]:
    return tuple(
        Suspect(rank=c.rank, node=c.node, reason=f"stalled: {c.reason}"[:512], avoid=c.certain)
        for c in verdict.culprits
    )


def worker_signal(pod: PodFacts) -> int | None:
    """The signal that killed the pod's worker or container, if the evidence names one."""
    codes = [int(code) for code in _WORKER_EXIT.findall(pod.message)]
    killed = [-code for code in codes if code < 0]
    if killed:
        return killed[0]
    if pod.exit_code is not None and pod.exit_code > 128:
        return pod.exit_code - 128
    return None


def _how(pod: PodFacts) -> str:
    if pod.state is PodState.GONE:
        return f"pod {pod.name} was lost before it finished ({pod.reason or 'deleted'})"
    signal = worker_signal(pod)
    if pod.reason in NODE_REASONS:
        what = pod.reason
    elif signal is not None:
        what = f"killed by signal {signal}"
    else:
        what = f"{pod.reason or 'Error'} with exit code {pod.exit_code}"
    return f"pod {pod.name} on node {pod.node}: {what}"


def _lost_to_its_node(pod: PodFacts) -> bool:
    """Lost with its node, or ended for a reason that points at the node by itself."""
    return pod.state is PodState.GONE or pod.reason in NODE_REASONS


def _speaks_for_itself(pod: PodFacts) -> bool:
    """Whether the pod's end names its cause without comparing it to the others: lost to
    its node, or its worker killed by a signal."""
    return _lost_to_its_node(pod) or worker_signal(pod) is not None


def awaiting_peers(
    failed: Sequence[PodFacts],
    current: Sequence[PodFacts],
    now: datetime,
    silent: Sequence[PodFacts] = (),
) -> bool:
    """The pods that ended only exited with an error and another pod of the attempt still
    runs: wait for it within PEERS_AWAITED of the first end (`finishedAt`, whole seconds),
    so that a rank killed by a signal, whose pod may end seconds after its victims', is
    the one attributed. Not when a running pod's agent went `silent`: it is that one."""
    if not failed or any(_speaks_for_itself(p) for p in failed) or silent:
        return False
    if not any(p.state is PodState.RUNNING for p in current):
        return False
    ends = [p.finished_at for p in failed if p.finished_at is not None]
    return bool(ends) and now - min(ends) < PEERS_AWAITED


def failure_suspects(
    failed: Sequence[PodFacts], pods: int | None = None, silent: Sequence[PodFacts] = ()
) -> tuple[Suspect, ...]:
    """The pods of one attempt that ended without a trip report, reduced to the culprits:
    lost with the node, else killed by a signal, else the running pods whose agents went
    `silent` while the failed ones only exited with an error, else the first to end.
    `pods` is how many the attempt has (default: the failed ones): the culprit is certain
    when it is told apart from at least one other pod, failed or still running."""
    if not failed:
        return ()
    total = max(pods or 0, len(failed))
    by_node = [p for p in failed if _lost_to_its_node(p)]
    if by_node:
        return tuple(_suspect(p, _how(p), True, node_lost=p.node_silent) for p in by_node)
    signalled = [p for p in failed if worker_signal(p) is not None]
    if silent and not signalled:
        ended = ", ".join(p.name for p in failed)
        why = f"its agent stopped answering, and {ended} failed on the broken collective"
        return tuple(_suspect(p, f"pod {p.name} on node {p.node}: {why}", True) for p in silent)
    candidates = signalled if signalled and len(signalled) < len(failed) else list(failed)
    stamped = [p for p in candidates if p.finished_at is not None]
    if not stamped:
        certain = len(candidates) < total
        return tuple(_suspect(p, _how(p), certain) for p in candidates)
    first = min(p.finished_at for p in stamped if p.finished_at is not None)
    earliest = [p for p in stamped if p.finished_at == first]
    certain = len(earliest) < total
    return tuple(_suspect(p, _how(p), certain) for p in earliest)


def _suspect(pod: PodFacts, reason: str, certain: bool, *, node_lost: bool = False) -> Suspect:
    return Suspect(
        rank=pod.rank, node=pod.node, reason=reason[:512], avoid=certain, node_lost=node_lost
    )


def failure_signature(pod: PodFacts) -> str:
    """What two failures are compared by: the failing rank's own last error line(s)
    (observe/failure_cause.py: an exception or an `error:` line, never torchrun's summary),
    else the signal that killed it, else its reason and exit code."""
    cause = failure_cause(pod.message)
    if cause.lines:
        return " / ".join(cause.lines)[:256]
    signal = worker_signal(pod)
    if signal is not None:
        return f"killed by signal {signal}"
    return f"{pod.reason or 'Error'} exit code {pod.exit_code}"[:256]


def failure_record(
    attempt: int,
    failed: Sequence[PodFacts],
    suspects: Sequence[Suspect],
    *,
    progressed: bool,
    step: int | None = None,
) -> FailureRecord:
    """How this attempt ended, from its culprit's own words: the error line(s) and the exit
    code of its failing rank (torchrun's own exit code is 1 whatever the rank's was), with
    the longer tail kept in `message`."""
    culprit_ranks = {s.rank for s in suspects}
    lead = next((p for p in failed if p.rank in culprit_ranks), failed[0])
    cause = failure_cause(lead.message)
    return FailureRecord(
        attempt=attempt,
        signature=failure_signature(lead),
        exit_code=cause.exit_code if cause.exit_code is not None else lead.exit_code,
        message=lead.message[-2048:],
        nodes=tuple(sorted({p.node for p in failed if p.node}))[:64],
        before_first_step=not progressed,
        step=step,
    )


def failure_side(current: FailureRecord, previous: FailureRecord | None) -> str:
    """`job` or `node`: whose fault a crash loop looks like, and why."""
    if previous is not None and current.signature == previous.signature:
        shared = set(current.nodes) & set(previous.nodes)
        if set(current.nodes) != set(previous.nodes) and not shared:
            return "the job's: the same error on different nodes"
        if shared and len(shared) < max(len(current.nodes), 1):
            return f"possibly node {', '.join(sorted(shared))}'s: it failed there both times"
        return "the job's: the same error again (on the same nodes, so a node is not ruled out)"
    if len(current.nodes) > 1:
        return "the job's: every rank failed before its first step, on different nodes"
    return "undecided: one node, one attempt"
