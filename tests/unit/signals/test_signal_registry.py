"""Every signal is computed somewhere: a signal left out of a registration fails here.

A signal the agent computes needs a place in AGENT_SIGNALS (or the operator's directives
never let the agent trip on it) and a MonitoredSignal in the monitor's list that fires it
(or the CRD and the rules accept it and it never fires); one the operator raises belongs
in OPERATOR_SIGNALS. These tests tie the lists together; docs/architecture.md says where
a new signal goes.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import stabletrain_contract.signals as signals_package
from stabletrain_contract.detection import DetectionConfig
from stabletrain_contract.names import AGENT_SIGNALS, OPERATOR_SIGNALS, Signal
from stabletrain_contract.signals import monitor as monitor_module
from stabletrain_contract.signals.monitor import SignalMonitor
from stabletrain_contract.signals.monitored import MonitoredSignal


def _subclasses(cls: type[MonitoredSignal]) -> set[type[MonitoredSignal]]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_signal_is_the_agent_s_or_the_operator_s() -> None:
    assert set(Signal) == AGENT_SIGNALS | OPERATOR_SIGNALS
    assert not AGENT_SIGNALS & OPERATOR_SIGNALS


def test_the_monitor_fires_exactly_the_agent_signals() -> None:
    """Fewer: an agent signal never fires. More: a signal the monitor fires that the
    directives refuse to trip on, so it could only ever be reported."""
    monitor = SignalMonitor(DetectionConfig(), trip_on=())
    fired = frozenset().union(*(type(signal).fires for signal in monitor.monitored))
    assert fired == AGENT_SIGNALS


def test_every_monitored_signal_of_the_package_runs_in_the_monitor() -> None:
    for module in pkgutil.iter_modules(signals_package.__path__):
        importlib.import_module(f"{signals_package.__name__}.{module.name}")
    monitor = SignalMonitor(DetectionConfig(), trip_on=())
    running = {type(signal) for signal in monitor.monitored}
    defined = {c for c in _subclasses(MonitoredSignal) if c.__module__.startswith("stabletrain_")}
    assert defined <= running, f"not in SignalMonitor's list: {defined - running}"


def test_a_monitor_without_a_fired_agent_signal_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check that makes a forgotten entry fail every run, not only this suite."""
    monkeypatch.setattr(monitor_module, "AGENT_SIGNALS", AGENT_SIGNALS | {Signal.STALLED})
    with pytest.raises(RuntimeError, match="no signal of the monitor fires Stalled"):
        SignalMonitor(DetectionConfig(), trip_on=())
