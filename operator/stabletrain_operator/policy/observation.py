"""What the operator saw fire, in one shape whatever channel it came through.

A trip report, a scraped `firing` finding, a failed pod and a person's rollback request all
become an `Observation`, so the rules are evaluated by one function and a replay of a
recorded run reaches the same decisions as the live operator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from stabletrain_contract.channel import AgentStatus, FindingReport
from stabletrain_contract.directives import SkipRange
from stabletrain_contract.names import AnomalyClass, Signal
from stabletrain_contract.trip_report import TripReport


class ObservationSource(StrEnum):
    """The channel an observation arrived through; it decides how urgent it is."""

    TRIP_REPORT = "TripReport"
    """The agent stopped training on every rank and left a trip report: something must happen."""
    POD_FAILURE = "PodFailure"
    """A worker crashed, was OOM-killed or evicted, or its node was lost, without a trip report."""
    HEARTBEAT = "Heartbeat"
    """The agents' heartbeats show no step progress for the stall bound (Stalled)."""
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
    recurrence_of: int | None = None
    """Onset of the rollback still being confirmed when this was seen: the same incident,
    so a rollback escalates whatever the distance between the onsets."""
    suspect_shards: tuple[str, ...] = ()
    """Trip reports only: every shard the lineage of the spike window names, most suspect
    first; empty when the loop keeps no lineage or the report had to cut the list."""

    @property
    def anchor_step(self) -> int | None:
        """The step a rollback is placed around: the onset when known, else the step seen."""
        return self.onset_step if self.onset_step is not None else self.step


def _infrastructure(
    signal: Signal, source: ObservationSource, *, step: int | None, evidence: str
) -> Observation:
    """A fault of the machinery around the model, sustained as soon as it is seen."""
    return Observation(
        signal=signal.value,
        anomaly_class=AnomalyClass.INFRASTRUCTURE,
        step=step,
        onset_step=step,
        sustained=True,
        tripped=False,
        evidence=evidence,
        source=source,
    )


def worker_failure(*, step: int | None, evidence: str) -> Observation:
    """A crashed, OOM-killed, evicted or lost worker: infrastructure, never the model's fault."""
    return _infrastructure(
        Signal.WORKER_FAILURE, ObservationSource.POD_FAILURE, step=step, evidence=evidence
    )


def stalled(*, step: int | None, evidence: str) -> Observation:
    """The run stopped making progress: infrastructure until proven otherwise."""
    return _infrastructure(
        Signal.STALLED, ObservationSource.HEARTBEAT, step=step, evidence=evidence
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


def trip_observation(reports: Sequence[TripReport]) -> Observation:
    """The trip reports of one attempt (every pod leaves one) as one observation.

    The first report leads (the caller orders them, e.g. earliest onset first); the other
    signals any pod saw firing at its trip step feed `whileFiring`.
    """
    if not reports:
        raise ValueError("no trip report to observe")
    lead = reports[0]
    firing = tuple(
        dict.fromkeys(s for report in reports for s in report.firing if s != lead.signal)
    )
    complete = all(report.suspect_shards_omitted == 0 for report in reports)
    suspects = tuple(dict.fromkeys(s for report in reports for s in report.suspect_shards))
    return Observation(
        signal=lead.signal,
        anomaly_class=lead.anomaly_class,
        step=lead.step,
        onset_step=lead.onset_step,
        sustained=True,
        tripped=True,
        evidence=lead.evidence,
        source=ObservationSource.TRIP_REPORT,
        firing_with=firing,
        suspect_shards=suspects if complete else (),
    )


def finding_observation(
    finding: FindingReport, *, step: int | None, firing_with: tuple[str, ...]
) -> Observation:
    """One finding of a pod's status endpoint: the run goes on while it fires."""
    return Observation(
        signal=finding.signal,
        anomaly_class=finding.anomaly_class,
        step=step,
        onset_step=finding.onset_step,
        sustained=finding.sustained,
        tripped=False,
        evidence=finding.evidence,
        source=ObservationSource.SCRAPE,
        firing_with=firing_with,
    )


def scrape_observations(statuses: Sequence[AgentStatus]) -> list[Observation]:
    """Every signal firing in the pods' status endpoints, once per signal (node rank 0's
    finding first: all ranks agree on the numbers, so one pod's view is enough)."""
    seen: set[str] = set()
    found: list[Observation] = []
    for agent in sorted(statuses, key=lambda status: status.node_rank):
        names = tuple(f.signal for f in agent.firing)
        for finding in agent.firing:
            if finding.signal in seen:
                continue
            seen.add(finding.signal)
            others = tuple(name for name in names if name != finding.signal)
            found.append(finding_observation(finding, step=agent.step, firing_with=others))
    return found
