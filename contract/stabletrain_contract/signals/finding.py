"""One signal firing at one step, and the one way a detector's reading becomes a finding.

Every signal reports through ``Finding.of`` so the fields the operator matches on (onset,
run length, sustained) mean the same for all of them; only the class and the evidence
sentence are the signal's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from stabletrain_contract.channel import FindingReport
from stabletrain_contract.names import AnomalyClass
from stabletrain_contract.trip_report import EVIDENCE_MAX


class AnomalousReading(Protocol):
    """What every detector's reading of an anomalous step carries."""

    @property
    def value(self) -> float: ...
    @property
    def threshold(self) -> float | None: ...
    @property
    def consecutive(self) -> int: ...
    @property
    def onset_step(self) -> int | None: ...
    @property
    def sustained(self) -> bool: ...


@dataclass(frozen=True)
class Finding:
    """One signal firing at one step, with the evidence a person needs to trust it."""

    signal: str
    """Signal name as the directives' trip list spells it (``LossSpike``, ``custom:<name>``)."""
    anomaly_class: AnomalyClass
    """Attribution class from the contract (bad batch, divergence, numerical, ...)."""
    value: float
    """The observed value that fired (loss, grad norm, tokens/s, custom value)."""
    threshold: float
    """The bound it crossed, in the same unit as ``value``."""
    onset_step: int
    """First step of the current consecutive run of anomalous steps."""
    consecutive: int
    """How many consecutive steps (including this one) have been anomalous."""
    sustained: bool
    """The run is long enough to count: only sustained findings can trip."""
    evidence: str
    """One sentence saying why this fired and why this class was chosen."""

    @classmethod
    def of(
        cls, signal: str, anomaly_class: AnomalyClass, reading: AnomalousReading, evidence: str
    ) -> Finding:
        """The finding for an anomalous reading; a threshold no rule could state is nan."""
        return cls(
            signal=signal,
            anomaly_class=anomaly_class,
            value=reading.value,
            threshold=math.nan if reading.threshold is None else reading.threshold,
            onset_step=onset_of(reading),
            consecutive=reading.consecutive,
            sustained=reading.sustained,
            evidence=evidence,
        )

    def to_report(self) -> FindingReport:
        """The finding as the status endpoint carries it (evidence cut to the contract's bound);
        the agent's exporter and the replay CLI both go through here, so they agree."""
        return FindingReport(
            signal=self.signal,
            anomaly_class=self.anomaly_class,
            value=self.value,
            threshold=self.threshold,
            onset_step=self.onset_step,
            consecutive=self.consecutive,
            sustained=self.sustained,
            evidence=self.evidence[:EVIDENCE_MAX],
        )


def onset_of(reading: AnomalousReading) -> int:
    """The first step of an anomalous reading's run, which its streak has always started."""
    onset = reading.onset_step
    assert onset is not None  # an anomalous reading has started a streak
    return onset
