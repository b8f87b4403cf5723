"""Stopping on purpose: the trip report and the exit that carries it to the operator.

torchrun turns any worker failure into exit code 1, so the reason travels in the
termination message (one writer per pod: local rank 0) and the process exit only has to
be non-zero. ``TrainingTripped`` subclasses SystemExit so an unhandled trip ends the
process quietly with that code, while a loop that wants to clean up can still catch it.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from stabletrain_agent.contract.checkpoint_inventory import INVENTORY_MAX, CompactCheckpoint
from stabletrain_agent.contract.names import AnomalyClass
from stabletrain_agent.contract.trip_report import (
    EVIDENCE_MAX,
    SUSPECT_SHARDS_MAX,
    TripReport,
    render_termination_message,
)
from stabletrain_agent.signals.monitor import Finding, Verdict

TRIP_EXIT_CODE = 3
"""Exit code of a worker that tripped (torchrun reports 1 for the pod regardless)."""


class TrainingTripped(SystemExit):
    """Raised on every rank at the same step when a trip threshold was crossed."""

    def __init__(self, report: TripReport) -> None:
        super().__init__(TRIP_EXIT_CODE)
        self.report = report

    def __str__(self) -> str:
        return (
            f"training tripped at step {self.report.step} on {self.report.signal} "
            f"({self.report.anomaly_class}): {self.report.evidence}"
        )


def build_trip_report(
    verdict: Verdict,
    *,
    attempt: int,
    node: str,
    last_good_step: int | None,
    pod: str | None = None,
    inventory: tuple[CompactCheckpoint, ...],
    lineage_path: str,
    suspect_shards: tuple[str, ...] = (),
    directives_generation: int | None = None,
) -> TripReport:
    """The contract's report for a tripping verdict; the first tripping finding leads. Of
    `inventory` (oldest first) the newest INVENTORY_MAX entries are kept, the rest counted."""
    if not verdict.tripping:
        raise ValueError(f"verdict of step {verdict.step} does not trip; nothing to report")
    lead: Finding = verdict.tripping[0]
    firing = tuple(dict.fromkeys(f.signal for f in verdict.findings))
    return TripReport(
        attempt=attempt,
        node=node,
        pod=pod,
        step=verdict.step,
        tripped_at=datetime.now(UTC),
        signal=lead.signal,
        anomaly_class=AnomalyClass(lead.anomaly_class),
        evidence=lead.evidence[:EVIDENCE_MAX],
        value=lead.value,
        threshold=lead.threshold,
        onset_step=lead.onset_step,
        last_good_step=last_good_step,
        firing=firing[:16],
        inventory=inventory[-INVENTORY_MAX:],
        inventory_omitted=max(0, len(inventory) - INVENTORY_MAX),
        lineage_path=lineage_path,
        suspect_shards=suspect_shards[:SUSPECT_SHARDS_MAX],
        suspect_shards_omitted=max(0, len(suspect_shards) - SUSPECT_SHARDS_MAX),
        directives_generation=directives_generation,
    )


def write_termination_message(path: Path, report: TripReport) -> None:
    """Write the report where the kubelet reads it (the file is bind-mounted: no rename)."""
    message = render_termination_message(report)
    with path.open("w", encoding="utf-8") as handle:
        handle.write(message)
        handle.flush()
        os.fsync(handle.fileno())
