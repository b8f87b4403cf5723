"""Stopping on purpose: the trip report and the exit that carries it to the operator.

torchrun turns any worker failure into exit code 1, so the reason travels in the
termination message (one writer per pod: local rank 0) and the process exit only has to
be non-zero. ``TrainingTripped`` subclasses SystemExit so an unhandled trip ends the
process quietly with that code, while a loop that wants to clean up can still catch it.
"""

from __future__ import annotations

import os
from pathlib import Path

from stabletrain_contract.trip_report import TripReport, render_termination_message

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


def write_termination_message(path: Path, report: TripReport) -> None:
    """Write the report where the kubelet reads it (the file is bind-mounted: no rename)."""
    message = render_termination_message(report)
    with path.open("w", encoding="utf-8") as handle:
        handle.write(message)
        handle.flush()
        os.fsync(handle.fileno())
