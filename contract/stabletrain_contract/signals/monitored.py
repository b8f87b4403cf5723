"""The seam between the monitor and each signal it runs.

The monitor knows signals only through this interface, so a new built-in signal is one
module implementing it plus one entry in the monitor's list: where its value comes from in
a step, how a firing reads, how a live directive retunes it, and which keys of the
monitor's checkpointed state are its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from stabletrain_contract.detection import DetectionConfig
from stabletrain_contract.names import Signal
from stabletrain_contract.signals.finding import Finding
from stabletrain_contract.signals.step_observation import StepObservation

NOTHING_FIRED: tuple[Finding, ...] = ()
"""What a quiet step returns, shared so the common case builds nothing."""


class MonitoredSignal(ABC):
    """One built-in signal (or a family, like the custom ones) as the monitor runs it.

    Signals own disjoint keys of the monitor's saved state, which keeps the checkpoint
    layout flat and readable by older and newer agents alike.
    """

    fires: ClassVar[frozenset[Signal]]
    """The built-in signals its findings name (none for the custom family, whose findings
    are `custom:<name>`): the monitor refuses to start when an agent signal has no
    MonitoredSignal that fires it."""

    @abstractmethod
    def observe(self, obs: StepObservation) -> Sequence[Finding]:
        """Judge this step; the findings, in the order the verdict lists them."""

    @abstractmethod
    def retune(self, config: DetectionConfig) -> None:
        """Apply live thresholds; what was learned (baselines, runs) survives."""

    @abstractmethod
    def save(self, state: dict[str, Any]) -> None:
        """Write this signal's keys into the monitor's JSON-able state."""

    @abstractmethod
    def load(self, state: dict[str, Any]) -> None:
        """Restore from the monitor's state; KeyError/TypeError/ValueError when it is
        incomplete or corrupt (the monitor reports those and keeps its old state)."""
