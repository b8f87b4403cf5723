"""Which checkpoint a rollback resumes from: a pure, deterministic function of the inventory.

Candidates are the stable, non-marker checkpoints with step <= onset - margin (a restart
after a fault outside the model passes `stable_only=False`: any non-marker checkpoint).
Walking them newest first, the first one complete and verified on the PFS is chosen:

1. if it is also verified on the local tier of every node the run will use, the ranks read
   it locally (source "local");
2. otherwise the nodes that lack it re-seed their local tier from the PFS (source "pfs");
3. a newer candidate without a verified PFS copy is passed over for an older one, because a
   node lost later would leave no way to restore it;
4. no candidate on the PFS: fail with the reason, listing what was rejected and why.

With `both_tiers` (the job's `checkpoints.selection: BothTiers`) step 2 is passed over too:
the first candidate also verified on every node's local tier wins, and the reason says how
many more steps it costs than the newest PFS-only one. A node counts against a candidate
only if it holds a copy written by the candidate's attempt: one that holds none (new to
the job, or back from an earlier attempt with that attempt's copies) could never have it
locally, and reads it from the PFS as a replaced node would. Without that, a node back
with an old copy made the run go back to that copy, thousands of steps (the chaos run's
hang: 3,125 steps). Only when no candidate is on both tiers is the newest PFS-verified one
taken, and the reason says that too.

A copy on local tiers only is never chosen: it does not survive the loss of its node.

The memory tier (`memory_pods`, a restart from the latest only): a snapshot that is on no
other tier is chosen only when every pod of the next attempt is kept, so its memory tier
survives the restart, and each of them holds that step verified in it; every rank then
restores from memory. A pod that is replaced has no memory any more: then the walk goes on
to the checkpoints on the PFS, as without the tier. A kept pod that holds a chosen PFS step
in its memory too reads it from there, and the reason says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from stabletrain_contract.checkpoint.inventory import CheckpointRecord


class NoCheckpointError(Exception):
    """No checkpoint satisfies the rollback's requirements; the message says why."""


@dataclass(frozen=True)
class Selection:
    step: int
    attempt: int
    source: Literal["memory", "local", "pfs"]
    reason: str
    newer_pfs_only: int | None = None
    """The newest candidate passed over because it was on the PFS only (both_tiers)."""


AFTER_LIMIT = "after the limit"
NOT_ON_PFS = "not verified on the PFS"
IN_MEMORY_ONLY = "in pod memory only"


def _rejection(record: CheckpointRecord, limit: int, stable_only: bool) -> str | None:
    if record.step > limit:
        return AFTER_LIMIT
    if record.spike_marker:
        return "a spike marker"
    if stable_only and not record.stable:
        return "not stable"
    if not (record.pfs.complete and record.pfs.verified):
        return IN_MEMORY_ONLY if record.memory and not record.local else NOT_ON_PFS
    return None


def _held_in(record: CheckpointRecord, pod: str | None) -> bool:
    copy = record.memory_copy(pod) if pod is not None else None
    return copy is not None and copy.complete and copy.verified


def _in_every_pods_memory(record: CheckpointRecord, memory_pods: Sequence[str | None]) -> bool:
    """Every pod of the next attempt is kept and holds the step verified in its memory."""
    return bool(memory_pods) and all(_held_in(record, pod) for pod in memory_pods)


def _from_memory_too(record: CheckpointRecord, memory_pods: Sequence[str | None]) -> str:
    pods = [pod for pod in memory_pods if pod is not None and _held_in(record, pod)]
    return f"; pods {', '.join(pods)} read it from their memory tier" if pods else ""


def _nodes_by_attempt(records: Sequence[CheckpointRecord]) -> dict[int, frozenset[str]]:
    """The nodes holding a local copy written by each attempt: the nodes it ran on."""
    nodes: dict[int, set[str]] = {}
    for record in records:
        nodes.setdefault(record.attempt, set()).update(copy.node for copy in record.local)
    return {attempt: frozenset(held) for attempt, held in nodes.items()}


def _missing_locally(record: CheckpointRecord, nodes: Sequence[str]) -> list[str]:
    return [
        node
        for node in nodes
        if not ((copy := record.local_copy(node)) and copy.complete and copy.verified)
    ]


def select_checkpoint(
    records: Sequence[CheckpointRecord],
    *,
    onset_step: int,
    margin: int,
    nodes: Sequence[str],
    both_tiers: bool = False,
    stable_only: bool = True,
    memory_pods: Sequence[str | None] = (),
) -> Selection:
    """The checkpoint to resume from for a spike that began at `onset_step`; with
    `stable_only=False` (a restart: the model was not at fault) a checkpoint saved while a
    signal fired counts too.

    `memory_pods` has one entry per pod of the next attempt: its name when the pod is kept
    (its memory tier survives the restart), None when it is new. Empty (the default): no
    memory tier survives, and memory snapshots are never chosen. Only a restart from the
    latest passes it: a rollback chooses from the local tier and the PFS.
    """
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if not nodes:
        raise ValueError("nodes must name at least one node the run will use")
    limit = onset_step - margin
    ordered = sorted(records, key=lambda r: (r.step, r.attempt), reverse=True)
    ran = _nodes_by_attempt(records) if both_tiers else {}
    passed_over: list[str] = []
    pfs_only: list[tuple[CheckpointRecord, list[str]]] = []
    for record in ordered:
        problem = _rejection(record, limit, stable_only)
        skipped = f"; passed over {', '.join(passed_over)}" if passed_over else ""
        # Newer than every candidate passed over for BothTiers: never a step further back.
        in_memory = not pfs_only and _in_every_pods_memory(record, memory_pods)
        if in_memory and problem in (None, NOT_ON_PFS, IN_MEMORY_ONLY):
            return _from_memory(record, memory_pods, skipped)
        if problem is not None:
            if problem != AFTER_LIMIT:
                passed_over.append(f"step {record.step} ({problem})")
            continue
        missing = _missing_locally(record, nodes)
        also = _from_memory_too(record, memory_pods)
        if not missing:
            newer = pfs_only[0][0].step if pfs_only else None
            cost = (
                f"; BothTiers: {newer - record.step} more steps than step {newer}, which "
                f"is on the PFS only (not on the local tier of "
                f"{', '.join(pfs_only[0][1])})"
                if newer is not None
                else ""
            )
            return Selection(
                record.step,
                record.attempt,
                "local",
                f"step {record.step} is verified on the PFS and on every node's local tier"
                f"{also}{cost}{skipped}",
                newer,
            )
        if both_tiers and not ran.get(record.attempt, frozenset()).isdisjoint(missing):
            pfs_only.append((record, missing))
            continue
        never_held = (
            f" (BothTiers: they hold no copy of attempt {record.attempt}, which wrote it)"
            if both_tiers
            else ""
        )
        return _from_pfs(record, missing, f"{never_held}{also}{skipped}")
    if pfs_only:
        record, missing = pfs_only[0]
        fallback = _from_pfs(record, missing, _from_memory_too(record, memory_pods))
        return Selection(
            fallback.step,
            fallback.attempt,
            "pfs",
            f"BothTiers: no checkpoint at or before step {limit} is on every node's local "
            f"tier; {fallback.reason}",
        )
    considered = f": rejected {', '.join(passed_over)}" if passed_over else ""
    stable = "stable " if stable_only else ""
    raise NoCheckpointError(
        f"no {stable}checkpoint at or before step {limit} (onset {onset_step} - margin "
        f"{margin}) is verified on the PFS{considered}"
    )


def _from_memory(
    record: CheckpointRecord, memory_pods: Sequence[str | None], skipped: str
) -> Selection:
    pods = ", ".join(pod for pod in memory_pods if pod is not None)
    return Selection(
        record.step,
        record.attempt,
        "memory",
        f"step {record.step} is verified in the memory tier of every pod of the next attempt, "
        f"all kept ({pods}): every rank restores from memory{skipped}",
    )


def _from_pfs(record: CheckpointRecord, missing: Sequence[str], skipped: str) -> Selection:
    return Selection(
        record.step,
        record.attempt,
        "pfs",
        f"step {record.step} is verified on the PFS; nodes {', '.join(missing)} re-seed "
        f"their local tier from it{skipped}",
    )
