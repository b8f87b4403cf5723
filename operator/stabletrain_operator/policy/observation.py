"""What the operator saw fire, in one shape whatever channel it came through.

A trip report, a scraped `firing` finding, a failed pod and a person's rollback request all
become an `Observation`, so the rules are evaluated by one function and a replay of a
recorded run reaches the same decisions as the live operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from stabletrain_agent.contract.directives import SkipRange
from stabletrain_agent.contract.names import AnomalyClass, Signal


class ObservationSource(StrEnum):
    """The channel an observation arrived through; it decides how urgent it is."""

    TRIP_REPORT = "TripReport"
    """The agent stopped training on every rank and left a trip report: something must happen."""
    POD_FAILURE = "PodFailure"
    """A worker crashed, was OOM-killed or evicted, or its node was lost, without a trip report."""
    SCRAPE = "Scrape"
    """A finding in a pod's status endpoint: the run keeps going while it fires."""
    MANUAL = "Manual"
    """spec.manualRollback: a person asked for a rollback."""


@dataclass(frozen=True)
class Observation:
    """One signal the operator saw fire, with what the rules and the plan need to know."""

    signal: str
    """A contract `Signal` value or `custom:<name>`."""
    anomaly_class: AnomalyClass | None
    """Attribution class; None only for a manual request, which claims no cause."""
    step: int | None
    """Step the signal was seen at (the trip step, the scraped step)."""
    onset_step: int | None
    """First step of the anomalous run; skip ranges and the rollback target hang off it."""
    sustained: bool
    """Long enough to count; a scraped finding that is not sustained yet is only recorded."""
    tripped: bool
    """The agent stopped training (trip report) rather than only reporting (scrape)."""
    evidence: str
    source: ObservationSource
    firing_with: tuple[str, ...] = ()
    """Other signals firing at the same step (a trip report's `firing`), for `whileFiring`."""
    request_id: str = ""
    """Manual requests only: spec.manualRollback.requestId, handled once."""
    to_step: int | None = None
    """Manual requests only: resume from the newest stable checkpoint at or before this."""
    lr_factor: float | None = None
    """Manual requests only: multiply the LR scale by this; None keeps it."""
    skip: tuple[SkipRange, ...] = ()
    """Manual requests only: data to skip in addition to the active ranges."""

    @property
    def anchor_step(self) -> int | None:
        """The step a rollback is placed around: the onset when known, else the step seen."""
        return self.onset_step if self.onset_step is not None else self.step


def worker_failure(*, step: int | None, evidence: str) -> Observation:
    """A crashed, OOM-killed, evicted or lost worker: infrastructure, never the model's fault."""
    return Observation(
        signal=Signal.WORKER_FAILURE.value,
        anomaly_class=AnomalyClass.INFRASTRUCTURE,
        step=step,
        onset_step=step,
        sustained=True,
        tripped=False,
        evidence=evidence,
        source=ObservationSource.POD_FAILURE,
    )


def manual_request(
    *,
    request_id: str,
    step: int | None,
    to_step: int | None,
    lr_factor: float | None,
    skip: tuple[SkipRange, ...],
    reason: str,
) -> Observation:
    """spec.manualRollback as an observation, so it takes the same path as automatic ones."""
    return Observation(
        signal=Signal.MANUAL.value,
        anomaly_class=None,
        step=step,
        onset_step=None,
        sustained=True,
        tripped=False,
        evidence=reason or f"manual rollback request {request_id}",
        source=ObservationSource.MANUAL,
        request_id=request_id,
        to_step=to_step,
        lr_factor=lr_factor,
        skip=skip,
    )
