"""The per-step seam between the torch guard and the torch-free detectors.

The guard hands over plain host numbers that every rank already agrees on, so the
monitor's verdict is identical on every rank without another collective. The monitor
never reads the clock or does I/O: the replay CLI feeds it a recorded run and must get
the verdicts the live run got.

Each signal lives in its own module behind `MonitoredSignal`; the monitor only runs the
list of them, turns their findings into a verdict and keeps the snapshot the exporter shows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from stabletrain_contract.detection import DetectionConfig
from stabletrain_contract.names import (
    AGENT_SIGNALS,
    CUSTOM_SIGNAL_PREFIX,
    AnomalyClass,
    is_signal_name,
)
from stabletrain_contract.signals.custom import CustomSignals
from stabletrain_contract.signals.finding import Finding
from stabletrain_contract.signals.loss_and_grad_norm import LossAndGradNormSpikes
from stabletrain_contract.signals.monitored import MonitoredSignal
from stabletrain_contract.signals.non_finite import NonFiniteValues
from stabletrain_contract.signals.step_observation import StepObservation
from stabletrain_contract.signals.throughput import ThroughputDrop
from stabletrain_contract.trip_rules import TripRule, stops_on

__all__ = [
    "STATE_VERSION",
    "Finding",
    "MonitorSnapshot",
    "SignalMonitor",
    "StepObservation",
    "Verdict",
]


class Verdict(NamedTuple):
    """The monitor's answer for one step (a tuple, as the snapshot: both are built on every
    step, where a frozen dataclass costs several times more)."""

    step: int
    trip: bool
    """Stop training now: a sustained finding names a signal the directives trip on."""
    findings: tuple[Finding, ...] = ()
    """Every signal firing this step, report-only ones included."""
    tripping: tuple[Finding, ...] = ()
    """The findings responsible for ``trip``; what the trip report names."""
    skip_update: bool = False
    """Loss or grad norm is non-finite: this step's update must not reach the weights."""


class MonitorSnapshot(NamedTuple):
    """What the exporter and the trip report show about the monitor's state."""

    step: int | None
    loss: float | None
    loss_baseline: float | None
    grad_norm: float | None
    grad_norm_baseline: float | None
    lr: float | None
    tokens_per_second: float | None
    throughput_baseline: float | None
    spike_active: bool
    consecutive_spike_steps: int
    spike_onset_step: int | None
    non_finite_total: int
    anomaly_class: AnomalyClass | None
    """Class of the most recent sustained finding, None while the run looks healthy."""
    custom: Mapping[str, float] = MappingProxyType({})
    findings: tuple[Finding, ...] = ()


STATE_VERSION = 1
"""Bumped whenever the layout of ``state_dict`` changes incompatibly."""

FIRST_LAYOUT_KEYS = frozenset(
    {"loss", "grad_norm", "history", "throughput", "custom", "non_finite", "non_finite_total"}
)
"""The signals' keys every version-1 state has. A signal that saves none of these and finds
none of its own keys in a state is newer than that checkpoint and is not loaded (a built-in
one starts fresh, a detector of the user's keeps its own state), so a new signal or a
detector the loop adds later never makes older checkpoints unloadable."""

MONITOR_KEYS = frozenset({"version", "last_good_step"})
"""The keys the monitor writes itself."""


class SignalMonitor:
    """Runs every signal on each step and turns their findings into one verdict.

    Deterministic and free of clocks and I/O: identical observations give identical
    verdicts on every rank and in the replay CLI.
    """

    def __init__(
        self,
        config: DetectionConfig,
        trip_on: Collection[str],
        trip_rules: Sequence[TripRule] | None = None,
        detectors: Sequence[MonitoredSignal] = (),
    ) -> None:
        """`detectors` are the user's own signals, run after the built-in ones through the
        same interface. Each fires only `custom:<name>` signals (a built-in name is the
        built-in detector's), named in `detection.custom` so rules and trip lists accept
        them; a detector's `load` must raise before it changes anything."""
        for detector in detectors:
            if type(detector).fires:
                raise ValueError(
                    f"{type(detector).__name__} claims built-in signals "
                    f"({', '.join(sorted(type(detector).fires))}); a detector of the user's "
                    f"fires only {CUSTOM_SIGNAL_PREFIX}<name> signals"
                )
        self._detectors = tuple(detectors)
        self._trip_on = frozenset(trip_on)
        self._trip_rules = None if trip_rules is None else tuple(trip_rules)
        self._non_finite = NonFiniteValues(config)
        self._spikes = LossAndGradNormSpikes(config)
        self._throughput = ThroughputDrop(config)
        self._built_in: tuple[MonitoredSignal, ...] = (
            self._non_finite,
            self._spikes,
            self._throughput,
            CustomSignals(config),
        )
        """Every built-in signal, in the order a verdict lists their findings; a new one is
        one entry here. The first three are also named because the snapshot (the
        exporter's gauges) shows their counts and baselines."""
        self._signals = (*self._built_in, *self._detectors)
        """What retunes, saves and loads: the built-in signals, then the user's."""
        _check_every_agent_signal_fires(self._signals)
        self._state_keys = _state_keys_apart(self._signals)
        self._config = config
        self._last_good_step: int | None = None
        self._snapshot = _empty_snapshot()

    @property
    def monitored(self) -> tuple[MonitoredSignal, ...]:
        """The signals this monitor runs, in the order a verdict lists their findings."""
        return self._signals

    @property
    def trip_on(self) -> frozenset[str]:
        return self._trip_on

    @property
    def last_good_step(self) -> int | None:
        """Last step every judged signal found healthy; the trip report's pre-spike anchor."""
        return self._last_good_step

    def reconfigure(
        self,
        config: DetectionConfig,
        trip_on: Collection[str],
        trip_rules: Sequence[TripRule] | None = None,
    ) -> None:
        """Apply live threshold directives; learned baselines survive, as do streaks."""
        self._config = config
        self._trip_on = frozenset(trip_on)
        self._trip_rules = None if trip_rules is None else tuple(trip_rules)
        for signal in self._signals:
            signal.retune(config)

    def observe(self, obs: StepObservation) -> Verdict:
        findings: list[Finding] = []
        for signal in self._built_in:
            findings.extend(signal.observe(obs))
        for detector in self._detectors:
            fired = detector.observe(obs)
            if fired:
                _check_users_findings(detector, fired)
                findings.extend(fired)
        self._snapshot = self._take_snapshot(obs, findings)
        if not findings:  # the usual step: nothing to weigh against the rules
            if self._spikes.loss_judged:
                self._last_good_step = obs.step
            return Verdict(obs.step, False, skip_update=self._non_finite.skip_update)
        firing = frozenset(f.signal for f in findings)
        tripping = tuple(f for f in findings if f.sustained and self._trips(f, firing))
        return Verdict(
            step=obs.step,
            trip=bool(tripping),
            findings=tuple(findings),
            tripping=tripping,
            skip_update=self._non_finite.skip_update,
        )

    def _trips(self, finding: Finding, firing: frozenset[str]) -> bool:
        """The directives' rules decide (their first match stops the run), else trip_on."""
        if self._trip_rules is None:
            return finding.signal in self._trip_on
        return stops_on(self._trip_rules, finding.signal, finding.anomaly_class, firing)

    def snapshot(self) -> MonitorSnapshot:
        return self._snapshot

    def _take_snapshot(self, obs: StepObservation, findings: list[Finding]) -> MonitorSnapshot:
        sustained = [f for f in findings if f.sustained]
        streak = self._spikes.loss_streak
        return MonitorSnapshot(
            step=obs.step,
            loss=obs.loss,
            loss_baseline=self._spikes.loss_baseline,
            grad_norm=obs.grad_norm,
            grad_norm_baseline=self._spikes.grad_norm_baseline,
            lr=obs.lr,
            tokens_per_second=obs.tokens_per_second,
            throughput_baseline=self._throughput.baseline,
            spike_active=streak.count > 0,
            consecutive_spike_steps=streak.count,
            spike_onset_step=streak.onset,
            non_finite_total=self._non_finite.total,
            anomaly_class=sustained[0].anomaly_class if sustained else None,
            custom=dict(obs.custom),
            findings=tuple(findings),
        )

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for checkpoints: baselines hold healthy values only. Each signal
        writes its own keys; the layout is flat so older checkpoints stay readable."""
        state: dict[str, Any] = {"version": STATE_VERSION}
        for signal in self._signals:
            signal.save(state)
        state["last_good_step"] = self._last_good_step
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore saved state; unconfigured custom signals are dropped, new ones start fresh.

        Raises ValueError naming the problem on a state from another layout version or
        with missing/corrupt parts, leaving this monitor unchanged.
        """
        version = state.get("version")
        if version != STATE_VERSION:
            raise ValueError(
                f"monitor state version {version!r} is not the supported {STATE_VERSION}"
            )
        fresh = SignalMonitor(self._config, self._trip_on, self._trip_rules, self._detectors)
        try:
            for signal, keys in zip(fresh._signals, fresh._state_keys, strict=True):
                if keys.isdisjoint(state) and keys.isdisjoint(FIRST_LAYOUT_KEYS):
                    continue  # newer than the checkpoint: nothing of it to load
                signal.load(state)
            good = state["last_good_step"]
            fresh._last_good_step = None if good is None else int(good)
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"monitor state is incomplete or malformed: {error!r}") from None
        self.__dict__.update(fresh.__dict__)


def _check_every_agent_signal_fires(signals: Sequence[MonitoredSignal]) -> None:
    """Refuse a monitor in which an agent signal has nothing that fires it: the CRD and the
    rules would accept the signal, and it would never fire."""
    unfired = AGENT_SIGNALS - frozenset().union(*(type(s).fires for s in signals))
    if unfired:
        names = ", ".join(sorted(unfired))
        raise RuntimeError(
            f"no signal of the monitor fires {names}, which AGENT_SIGNALS lists: add its "
            "MonitoredSignal to SignalMonitor's list (signals/monitor.py)"
        )


def _state_keys_apart(signals: Sequence[MonitoredSignal]) -> tuple[frozenset[str], ...]:
    """The keys each signal saves under, refusing two signals that share one: in the flat
    state the later would overwrite the earlier's, and a restore would feed one signal the
    other's state (a detector of the user's named like a built-in's key, or two of them)."""
    owners = dict.fromkeys(MONITOR_KEYS, "the monitor")
    keys_of = []
    for signal in signals:
        own: dict[str, Any] = {}
        signal.save(own)
        for key in own:
            if key in owners:
                raise ValueError(
                    f"{type(signal).__name__} saves its state under {key!r}, which "
                    f"{owners[key]} uses already: give it a key of its own"
                )
            owners[key] = type(signal).__name__
        keys_of.append(frozenset(own))
    return tuple(keys_of)


def _check_users_findings(detector: MonitoredSignal, findings: Sequence[Finding]) -> None:
    """A user's finding must be `custom:<name>`: another name would be refused by the
    operator with the whole status, or pass for a built-in signal's. Say which, and whose."""
    for finding in findings:
        if not (is_signal_name(finding.signal) and finding.signal.startswith(CUSTOM_SIGNAL_PREFIX)):
            raise ValueError(
                f"{type(detector).__name__} fired {finding.signal!r}: a detector of the "
                f"user's fires custom_signal(name) for a detection.custom entry's name"
            )


def _empty_snapshot() -> MonitorSnapshot:
    return MonitorSnapshot(
        step=None,
        loss=None,
        loss_baseline=None,
        grad_norm=None,
        grad_norm_baseline=None,
        lr=None,
        tokens_per_second=None,
        throughput_baseline=None,
        spike_active=False,
        consecutive_spike_steps=0,
        spike_onset_step=None,
        non_finite_total=0,
        anomaly_class=None,
    )
