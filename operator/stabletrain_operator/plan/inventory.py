"""One checkpoint inventory from every source the operator has: the last scrapes of each
pod's status endpoint and the compact inventories in trip reports.

The trip report is the fresher source (the agent flushes PFS replication before it writes
it), the scrape the richer one (times, every node); merging keeps, per checkpoint, the union
of local copies and the best PFS verdict, as the agent's own merge does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stabletrain_agent.checkpoint.inventory import merge_records
from stabletrain_agent.contract.channel import AgentStatus
from stabletrain_agent.contract.inventory import CheckpointRecord, expand_entry
from stabletrain_agent.contract.trip import TripReport
from stabletrain_operator.api.status import INVENTORY_MAX


def trip_inventory(report: TripReport) -> list[CheckpointRecord]:
    """The compact entries of a trip report as full records (timed at the trip)."""
    return [expand_entry(entry, report.node, report.tripped_at) for entry in report.inventory]


def merged_inventory(
    known: Sequence[CheckpointRecord],
    statuses: Iterable[AgentStatus] = (),
    trips: Iterable[TripReport] = (),
) -> tuple[CheckpointRecord, ...]:
    """Everything known, oldest first, capped to the newest INVENTORY_MAX for status."""
    reports: list[Sequence[CheckpointRecord]] = [list(known)]
    reports += [list(status.inventory) for status in statuses]
    reports += [trip_inventory(trip) for trip in trips]
    return tuple(merge_records(reports)[-INVENTORY_MAX:])
