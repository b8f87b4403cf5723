"""One checkpoint inventory from every source the operator has: the last scrapes of each
pod's status endpoint and the compact inventories in trip reports.

The inventory is what exists now, not everything ever seen: retention deletes checkpoints
and a rollback abandons the ones after its target, and a plan made from a record of a
deleted or abandoned checkpoint sends the pods after a step they cannot restore. So a fresh
report replaces what was known about its node's local tier and its pod's memory tier, and a
checkpoint no fresh report lists any more is gone from the PFS too (every agent scans the
whole PFS); what was known only from other nodes' local tiers or other pods' memory stays
until those report. An agent that has
not exported a scan yet (no PFS condition reported, e.g. just started) only adds. A trip
report is fresh (the agent flushes replication and scans before it writes it), but may omit
its oldest entries to fit 4 KiB: below its oldest listed step it replaces nothing; an empty
one (a guard without a checkpoint manager) only adds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.checkpoint.inventory import CheckpointRecord, TierCopy, expand_entry
from stabletrain_contract.checkpoint.inventory_merge import merge_records
from stabletrain_contract.trip_report import TripReport
from stabletrain_operator.api.status import INVENTORY_MAX


def trip_inventory(report: TripReport) -> list[CheckpointRecord]:
    """The compact entries of a trip report as full records (timed at the trip)."""
    return [
        expand_entry(entry, report.node, report.tripped_at, report.pod)
        for entry in report.inventory
    ]


@dataclass(frozen=True)
class _Report:
    node: str
    pod: str | None
    """The pod whose memory tier the report speaks for (None: an agent without one)."""
    records: list[CheckpointRecord]
    replaces_from: int | None
    """Known records at or after this step are replaced by this report; None: it only adds."""


def _status_report(status: AgentStatus) -> _Report:
    scanned = status.pfs_available is not None
    return _Report(status.node, status.pod, list(status.inventory), 0 if scanned else None)


def _trip_report(trip: TripReport) -> _Report:
    records = trip_inventory(trip)
    if not records:  # a guard without a checkpoint manager reports none: no scan to trust
        return _Report(trip.node, trip.pod, records, None)
    oldest = min(r.step for r in records) if trip.inventory_omitted else 0
    return _Report(trip.node, trip.pod, records, oldest)


def _what_stays(record: CheckpointRecord, reports: Sequence[_Report]) -> CheckpointRecord | None:
    """The part of a known record no fresh report speaks for (None: nothing stays)."""
    replacing = [
        r for r in reports if r.replaces_from is not None and record.step >= r.replaces_from
    ]
    if not replacing:
        return record
    nodes = {r.node for r in replacing}
    pods = {r.pod for r in replacing if r.pod is not None}
    local = tuple(copy for copy in record.local if copy.node not in nodes)
    memory = tuple(copy for copy in record.memory if copy.pod not in pods)
    key = (record.step, record.attempt)
    listed = any(key in {(x.step, x.attempt) for x in r.records} for r in replacing)
    if not local and not memory and not listed:
        return None
    # Still there: a complete PFS copy stays complete (parts only arrive until retention
    # deletes the checkpoint), even if this scan ran before another node's part landed.
    pfs = record.pfs if listed else TierCopy()
    return record.model_copy(update={"local": local, "memory": memory, "pfs": pfs})


def merged_inventory(
    known: Sequence[CheckpointRecord],
    statuses: Iterable[AgentStatus] = (),
    trips: Iterable[TripReport] = (),
) -> tuple[CheckpointRecord, ...]:
    """What exists now, oldest first, capped to the newest INVENTORY_MAX for status."""
    reports = [_status_report(s) for s in statuses] + [_trip_report(t) for t in trips]
    if not reports:
        return tuple(known)
    kept = [stays for record in known if (stays := _what_stays(record, reports)) is not None]
    merged = merge_records([kept, *(report.records for report in reports)])
    return tuple(merged[-INVENTORY_MAX:])


def copies_in_flight(status: AgentStatus) -> bool:
    """The pod still has copies to write to a PFS taking its writes. From an agent that
    does not say (`replicating` null): its last scan lists a copy on its node's local tier
    not complete on the PFS, which may also be one that never completes (another node's
    part given up, an attempt fenced off), waited for in vain."""
    if status.pfs_available is not True:
        return False
    if status.replicating is not None:
        return bool(status.replicating)
    return any(record.local and not record.pfs.complete for record in status.inventory)


def without_abandoned(
    records: Sequence[CheckpointRecord], resume_step: int, attempt: int
) -> tuple[CheckpointRecord, ...]:
    """The agents' fence rule: once `attempt` resumes from `resume_step`, the checkpoints
    older attempts saved after that step lie on an abandoned trajectory and are dropped."""
    return tuple(r for r in records if r.attempt >= attempt or r.step <= resume_step)
