"""Which checkpoints exist where, and whether they can be trusted.

A rollback may only resume from a checkpoint that is complete and verified on the PFS and
on every node's local tier it will be read from, and that was marked stable (written before
any anomaly). A restart from the latest may also resume from the memory tier of pods that
are kept. This schema is what the agent reports and what the operator's checkpoint choice
reads; the compact form squeezes it into the 4 KiB trip report.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from enum import IntFlag

from pydantic import AwareDatetime, Field

from stabletrain_contract.base import AgentReport

NODE_NAME_MAX = 253
"""A Kubernetes node name is a DNS subdomain."""
POD_NAME_MAX = 253
"""So is a pod name."""
NODES_MAX = 10_000
"""Pods of the largest job (spec.workers.nodes): a record merged from every node's report
holds at most one local copy per pod."""
INVENTORY_MAX = 64
"""Checkpoints one report lists, the newest: the job's status keeps as many, and the
operator plans from them (a trip report holds fewer still)."""


class TierCopy(AgentReport):
    """One copy of a checkpoint on one tier."""

    complete: bool = False
    """All files and the manifest were written and renamed into place."""
    verified: bool = False
    """Checksums were re-read and match the manifest; implies complete."""


class NodeCopy(TierCopy):
    """A checkpoint's copy on one node's local tier."""

    node: str = Field(min_length=1, max_length=NODE_NAME_MAX)
    """Kubernetes node whose local tier holds the copy."""


class PodCopy(TierCopy):
    """A checkpoint's snapshot in one pod's memory tier: gone with the pod, kept across a
    restart of its training processes."""

    pod: str = Field(min_length=1, max_length=POD_NAME_MAX)
    """Pod whose memory tier holds the snapshot."""


class CheckpointRecord(AgentReport):
    """Everything known about the checkpoint of one step."""

    step: int = Field(ge=0)
    """Global optimizer step after which the checkpoint was taken."""
    attempt: int = Field(ge=0)
    """Attempt that wrote it: a checkpoint of a fenced-off attempt is never trusted."""
    stable: bool = False
    """Written while no signal was firing and confirmed healthy afterwards."""
    spike_marker: bool = False
    """Kept as evidence of an anomaly (at most a few per job); never a rollback target."""
    saved_at: AwareDatetime
    """When the local save completed."""
    pfs: TierCopy = Field(default_factory=TierCopy)
    local: tuple[NodeCopy, ...] = Field(default=(), max_length=NODES_MAX, fail_fast=True)
    """One entry per node that holds a local copy."""
    memory: tuple[PodCopy, ...] = Field(default=(), max_length=NODES_MAX, fail_fast=True)
    """One entry per pod that holds a snapshot in its memory tier."""

    def local_copy(self, node: str) -> NodeCopy | None:
        return next((copy for copy in self.local if copy.node == node), None)

    def memory_copy(self, pod: str) -> PodCopy | None:
        return next((copy for copy in self.memory if copy.pod == pod), None)


class CopyFlags(IntFlag):
    """Bits of a compact inventory entry, as seen from the node that writes the report."""

    STABLE = 1
    SPIKE_MARKER = 2
    PFS_COMPLETE = 4
    PFS_VERIFIED = 8
    LOCAL_COMPLETE = 16
    LOCAL_VERIFIED = 32
    MEMORY_COMPLETE = 64
    MEMORY_VERIFIED = 128


CompactCheckpoint = tuple[int, int, int]
"""`[step, attempt, CopyFlags]`: about 20 bytes of JSON, so a trip report holds ~150."""


def compact_entry(record: CheckpointRecord, node: str, pod: str | None = None) -> CompactCheckpoint:
    """The compact form of `record` from the point of view of `node`'s local tier and
    `pod`'s memory tier."""
    flags = CopyFlags(0)
    if record.stable:
        flags |= CopyFlags.STABLE
    if record.spike_marker:
        flags |= CopyFlags.SPIKE_MARKER
    if record.pfs.complete:
        flags |= CopyFlags.PFS_COMPLETE
    if record.pfs.verified:
        flags |= CopyFlags.PFS_VERIFIED
    local = record.local_copy(node)
    if local is not None and local.complete:
        flags |= CopyFlags.LOCAL_COMPLETE
    if local is not None and local.verified:
        flags |= CopyFlags.LOCAL_VERIFIED
    memory = record.memory_copy(pod) if pod is not None else None
    if memory is not None and memory.complete:
        flags |= CopyFlags.MEMORY_COMPLETE
    if memory is not None and memory.verified:
        flags |= CopyFlags.MEMORY_VERIFIED
    return (record.step, record.attempt, int(flags))


def compact_inventory(
    records: Iterable[CheckpointRecord], node: str, pod: str | None = None
) -> tuple[CompactCheckpoint, ...]:
    """All records, oldest step first, in compact form."""
    return tuple(compact_entry(r, node, pod) for r in sorted(records, key=lambda r: r.step))


def expand_entry(
    entry: CompactCheckpoint, node: str, saved_at: datetime, pod: str | None = None
) -> CheckpointRecord:
    """A full record from a compact entry; the compact form carries no time, so pass one.
    Memory flags mean nothing without the pod they were seen from (a report of an agent
    that names no pod): then no memory copy is listed."""
    step, attempt, raw = entry
    flags = CopyFlags(raw)
    local_complete = CopyFlags.LOCAL_COMPLETE in flags
    local_verified = CopyFlags.LOCAL_VERIFIED in flags
    memory_complete = CopyFlags.MEMORY_COMPLETE in flags
    memory_verified = CopyFlags.MEMORY_VERIFIED in flags
    return CheckpointRecord(
        step=step,
        attempt=attempt,
        stable=CopyFlags.STABLE in flags,
        spike_marker=CopyFlags.SPIKE_MARKER in flags,
        saved_at=saved_at,
        pfs=TierCopy(
            complete=CopyFlags.PFS_COMPLETE in flags, verified=CopyFlags.PFS_VERIFIED in flags
        ),
        local=(
            (NodeCopy(node=node, complete=local_complete, verified=local_verified),)
            if local_complete or local_verified
            else ()
        ),
        memory=(
            (PodCopy(pod=pod, complete=memory_complete, verified=memory_verified),)
            if pod is not None and (memory_complete or memory_verified)
            else ()
        ),
    )
