"""Which checkpoint a rollback resumes from: a pure, deterministic function of the inventory.

Candidates are the stable, non-marker checkpoints with step <= onset - margin.  Walking
them newest first, the first one complete and verified on the PFS is chosen:

1. if it is also verified on the local tier of every node the run will use, the ranks read
   it locally (source "local");
2. otherwise the nodes that lack it re-seed their local tier from the PFS (source "pfs");
3. a newer candidate without a verified PFS copy is passed over for an older one, because a
   node lost later would leave no way to restore it;
4. no candidate on the PFS: fail with the reason, listing what was rejected and why.

A copy on local tiers only is never chosen: it does not survive the loss of its node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from stabletrain_agent.contract.inventory import CheckpointRecord


class NoCheckpointError(Exception):
    """No checkpoint satisfies the rollback's requirements; the message says why."""


@dataclass(frozen=True)
class Selection:
    step: int
    attempt: int
    source: Literal["local", "pfs"]
    reason: str


def _rejection(record: CheckpointRecord, limit: int) -> str | None:
    if record.step > limit:
        return "after the limit"
    if record.spike_marker:
        return "a spike marker"
    if not record.stable:
        return "not stable"
    if not (record.pfs.complete and record.pfs.verified):
        return "not verified on the PFS"
    return None


def select_checkpoint(
    records: Sequence[CheckpointRecord],
    *,
    onset_step: int,
    margin: int,
    nodes: Sequence[str],
) -> Selection:
    """The checkpoint to resume from for a spike that began at `onset_step`."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if not nodes:
        raise ValueError("nodes must name at least one node the run will use")
    limit = onset_step - margin
    ordered = sorted(records, key=lambda r: (r.step, r.attempt), reverse=True)
    passed_over: list[str] = []
    for record in ordered:
        problem = _rejection(record, limit)
        if problem is not None:
            if problem != "after the limit":
                passed_over.append(f"step {record.step} ({problem})")
            continue
        missing = [
            node
            for node in nodes
            if not ((copy := record.local_copy(node)) and copy.complete and copy.verified)
        ]
        skipped = f"; passed over {', '.join(passed_over)}" if passed_over else ""
        if not missing:
            return Selection(
                record.step,
                record.attempt,
                "local",
                f"step {record.step} is verified on the PFS and on every node's local tier"
                f"{skipped}",
            )
        return Selection(
            record.step,
            record.attempt,
            "pfs",
            f"step {record.step} is verified on the PFS; nodes {', '.join(missing)} re-seed "
            f"their local tier from it{skipped}",
        )
    considered = f": rejected {', '.join(passed_over)}" if passed_over else ""
    raise NoCheckpointError(
        f"no stable checkpoint at or before step {limit} (onset {onset_step} - margin {margin}) "
        f"is verified on the PFS{considered}"
    )
