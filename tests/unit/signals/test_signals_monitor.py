"""The SignalMonitor on whole runs, with the contract's DEFAULT thresholds unless stated."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable

import pytest

from stabletrain_contract.detection import (
    CustomSignalConfig,
    DetectionConfig,
    LossSpikeConfig,
    ThresholdKind,
)
from stabletrain_contract.directives import DEFAULT_TRIP_ON
from stabletrain_contract.names import AnomalyClass, Signal
from stabletrain_contract.signals.monitor import SignalMonitor, StepObservation, Verdict
from stabletrain_contract.trip_report import EVIDENCE_MAX
from stabletrain_contract.trip_rules import TripRule

LOSS = Signal.LOSS_SPIKE.value


def _obs(
    step: int,
    loss: float,
    grad_norm: float | None = 1.0,
    *,
    lr: float = 3e-4,
    tokens_per_second: float | None = None,
    custom: dict[str, float] | None = None,
    checkpoint_in_flight: bool = False,
    steps_since_start: int | None = None,
) -> StepObservation:
    return StepObservation(
        step=step,
        loss=loss,
        grad_norm=grad_norm,
        lr=lr,
        tokens_per_second=tokens_per_second,
        custom=custom or {},
        checkpoint_in_flight=checkpoint_in_flight,
        steps_since_start=step if steps_since_start is None else steps_since_start,
    )


def _noisy(level: float, count: int, seed: int, spread: float = 0.02) -> list[float]:
    rng = random.Random(seed)
    return [level * (1.0 + rng.gauss(0.0, spread)) for _ in range(count)]


def _run(monitor: SignalMonitor, observations: Iterable[StepObservation]) -> list[Verdict]:
    verdicts = []
    for obs in observations:
        verdict = monitor.observe(obs)
        verdicts.append(verdict)
        if verdict.trip:
            break
    return verdicts


def _default_monitor(trip_on: Iterable[str] = DEFAULT_TRIP_ON) -> SignalMonitor:
    return SignalMonitor(DetectionConfig(), trip_on=tuple(trip_on))


def test_slow_noisy_decline_never_fires() -> None:
    rng = random.Random(11)
    steps = 5000
    monitor = _default_monitor()
    verdicts = _run(
        monitor,
        (
            _obs(
                step,
                loss=(4.0 - 2.0 * step / steps) * (1.0 + rng.gauss(0.0, 0.03)),
                grad_norm=1.0 + abs(rng.gauss(0.0, 0.2)),
            )
            for step in range(steps)
        ),
    )
    assert len(verdicts) == steps
    assert not any(v.trip for v in verdicts)
    assert [f for v in verdicts for f in v.findings if f.signal == LOSS] == []
    baseline = monitor.snapshot().loss_baseline
    assert baseline is not None
    assert 1.9 < baseline < 2.2  # the baseline followed the decline


def test_sustained_two_x_spike_trips_with_the_correct_onset() -> None:
    healthy = _noisy(2.0, 600, seed=1)
    monitor = _default_monitor()
    observations = [_obs(s, v) for s, v in enumerate(healthy)]
    observations += [_obs(600 + i, 4.0 * (1.0 + 0.01 * i)) for i in range(20)]
    verdicts = _run(monitor, observations)
    last = verdicts[-1]
    required = DetectionConfig().loss_spike.consecutive_steps
    assert last.trip
    assert last.step == 600 + required - 1
    (tripping,) = last.tripping
    assert tripping.signal == LOSS
    assert tripping.onset_step == 600
    assert tripping.consecutive == required
    assert tripping.anomaly_class is AnomalyClass.BAD_BATCH
    assert "step 600" in tripping.evidence
    assert monitor.last_good_step == 599
    snapshot = monitor.snapshot()
    assert snapshot.spike_active
    assert snapshot.spike_onset_step == 600
    assert snapshot.consecutive_spike_steps == required
    assert snapshot.loss_baseline == pytest.approx(2.0, rel=0.03)  # the spike stayed out


def test_one_step_one_and_a_half_x_outlier_reports_but_does_not_trip() -> None:
    losses = _noisy(2.0, 800, seed=2)
    losses[500] = 1.5 * 2.0  # the benign outlier: inside the default band entirely
    losses[650] = 1.9 * 2.0  # a sharper single step: reported, never sustained
    monitor = _default_monitor()
    verdicts = _run(monitor, (_obs(s, v) for s, v in enumerate(losses)))
    assert len(verdicts) == 800
    assert not any(v.trip for v in verdicts)
    fired = [f for v in verdicts for f in v.findings]
    assert [(f.signal, f.onset_step, f.sustained) for f in fired] == [(LOSS, 650, False)]


def test_nan_skips_the_update_and_trips_when_sustained() -> None:
    monitor = _default_monitor()
    healthy = [_obs(s, v) for s, v in enumerate(_noisy(2.0, 300, seed=3))]
    assert not any(v.trip or v.skip_update for v in _run(monitor, healthy))

    lone = monitor.observe(_obs(300, math.nan))
    assert lone.skip_update
    assert not lone.trip
    assert not monitor.observe(_obs(301, 2.0)).skip_update

    verdicts = _run(
        monitor, [_obs(302, math.nan), _obs(303, 2.0, grad_norm=math.inf), _obs(304, math.nan)]
    )
    assert [v.skip_update for v in verdicts] == [True, True, True]
    assert [v.trip for v in verdicts] == [False, False, True]
    (tripping,) = verdicts[-1].tripping
    assert tripping.signal == Signal.NON_FINITE.value
    assert tripping.anomaly_class is AnomalyClass.NUMERICAL
    assert tripping.onset_step == 302
    assert monitor.snapshot().non_finite_total == 4
    assert monitor.snapshot().loss_baseline == pytest.approx(2.0, rel=0.03)


def test_grad_norm_leading_the_loss_is_divergence_bloom_176b() -> None:
    """BLOOM-176B: grad norm rose at 31216, loss went 2.20 -> 5.10 at 31219."""
    monitor = _default_monitor()
    start, onset = 30_000, 31_219
    losses = _noisy(2.20, onset - start, seed=4)
    grads = _noisy(0.3, onset - start, seed=5, spread=0.1)
    observations = [
        _obs(start + i, loss, grad)
        for i, (loss, grad) in enumerate(zip(losses, grads, strict=True))
    ]
    for i in range(3):
        observations[-3 + i] = _obs(31_216 + i, 2.21, 0.3 * (5 + 3 * i))
    observations += [_obs(onset + i, 5.10, 4.0) for i in range(10)]
    verdicts = _run(monitor, observations)

    warning = verdicts[-1 - (onset - 31_216) - 3]
    assert warning.step == 31_216
    assert [(f.signal, f.anomaly_class, f.sustained) for f in warning.findings] == [
        (Signal.GRAD_NORM_SPIKE.value, AnomalyClass.DIVERGENCE, False)
    ]
    last = verdicts[-1]
    assert last.trip
    assert last.step == onset + 3
    (tripping,) = last.tripping
    assert tripping.onset_step == onset
    assert tripping.anomaly_class is AnomalyClass.DIVERGENCE
    assert "31216" in tripping.evidence
    firing = {f.signal for f in last.findings}
    assert firing == {LOSS, Signal.GRAD_NORM_SPIKE.value}  # grad-norm only reports by default


@pytest.mark.parametrize(
    ("before", "during"),
    [
        pytest.param(2.20, 5.10, id="BLOOM-176B 2.20->5.10"),
        pytest.param(6.44, 11.42, id="BigScience-104B 6.44->11.42"),
        pytest.param(2.77, 7.34, id="BigScience-13B 2.77->7.34"),
    ],
)
def test_public_logbook_spikes_trip_with_the_default_config_when_sustained(
    before: float, during: float
) -> None:
    required = DetectionConfig().loss_spike.consecutive_steps
    onset = 700
    healthy = [_obs(s, v) for s, v in enumerate(_noisy(before, onset, seed=6))]
    brief = _default_monitor()
    brief_run = healthy + [_obs(onset + i, during) for i in range(required - 1)]
    brief_run += [_obs(onset + required - 1 + i, before) for i in range(50)]
    assert not any(v.trip for v in _run(brief, brief_run))

    sustained = _default_monitor()
    verdicts = _run(sustained, healthy + [_obs(onset + i, during) for i in range(50)])
    assert verdicts[-1].trip
    assert verdicts[-1].step == onset + required - 1
    assert verdicts[-1].tripping[0].onset_step == onset


def test_throughput_dips_after_restart_and_during_save_are_excused_a_real_drop_is_not() -> None:
    config = DetectionConfig()
    grace = config.throughput.grace_steps
    monitor = SignalMonitor(config, trip_on=(*DEFAULT_TRIP_ON, Signal.THROUGHPUT_DROP.value))
    rng = random.Random(9)

    def tps(level: float) -> float:
        return level * (1.0 + rng.gauss(0.0, 0.02))

    steps = [_obs(s, 2.0, tokens_per_second=tps(10_000.0)) for s in range(400)]
    # A restart at step 400: the first `grace` steps are slow while caches warm.
    steps += [
        _obs(400 + i, 2.0, tokens_per_second=tps(1_000.0), steps_since_start=i)
        for i in range(grace)
    ]
    steps += [
        _obs(400 + grace + i, 2.0, tokens_per_second=tps(10_000.0), steps_since_start=grace + i)
        for i in range(100)
    ]
    # A save in flight for 30 steps, and the steps just after it.
    first_save = 400 + grace + 100
    steps += [
        _obs(
            first_save + i,
            2.0,
            tokens_per_second=tps(2_000.0),
            checkpoint_in_flight=True,
            steps_since_start=grace + 100 + i,
        )
        for i in range(30)
    ]
    steps += [
        _obs(first_save + 30 + i, 2.0, tokens_per_second=tps(3_000.0), steps_since_start=1000 + i)
        for i in range(grace)
    ]
    steps += [
        _obs(
            first_save + 30 + grace + i,
            2.0,
            tokens_per_second=tps(10_000.0),
            steps_since_start=2000 + i,
        )
        for i in range(50)
    ]
    verdicts = _run(monitor, steps)
    assert len(verdicts) == len(steps)
    assert [f for v in verdicts for f in v.findings] == []

    drop_at = steps[-1].step + 1
    drop = [
        _obs(drop_at + i, 2.0, tokens_per_second=tps(3_000.0), steps_since_start=3000 + i)
        for i in range(40)
    ]
    verdicts = _run(monitor, drop)
    assert verdicts[-1].trip
    assert verdicts[-1].step == drop_at + config.throughput.consecutive_steps - 1
    (tripping,) = verdicts[-1].tripping
    assert tripping.signal == Signal.THROUGHPUT_DROP.value
    assert tripping.anomaly_class is AnomalyClass.INFRASTRUCTURE
    assert tripping.onset_step == drop_at


def test_throughput_drop_only_reports_under_the_default_trip_list() -> None:
    monitor = _default_monitor()
    steps = [_obs(s, 2.0, tokens_per_second=10_000.0) for s in range(300)]
    steps += [_obs(300 + i, 2.0, tokens_per_second=1_000.0) for i in range(30)]
    verdicts = _run(monitor, steps)
    assert not any(v.trip for v in verdicts)
    assert verdicts[-1].findings[0].sustained


def test_recurring_grad_norm_spikes_point_at_the_lr() -> None:
    monitor = _default_monitor()
    observations = [_obs(s, 2.0, 1.0, lr=1e-4 * (1 + s / 1000)) for s in range(300)]
    for start in (200, 230, 260):
        for i in range(2):
            observations[start + i] = _obs(start + i, 2.0, 8.0, lr=observations[start + i].lr)
    observations += [_obs(300 + i, 4.0, 8.0, lr=1.3e-4) for i in range(5)]
    verdicts = _run(monitor, observations)
    assert verdicts[-1].trip
    assert verdicts[-1].tripping[0].anomaly_class is AnomalyClass.LR_TOO_HIGH
    assert "LR rose" in verdicts[-1].tripping[0].evidence
    assert len(verdicts[-1].tripping[0].evidence) <= EVIDENCE_MAX


def test_custom_signal_trips_when_named_in_trip_on() -> None:
    config = DetectionConfig(
        custom=(
            CustomSignalConfig(
                name="val_loss",
                kind=ThresholdKind.ABOVE,
                threshold=3.2,
                consecutive_steps=2,
                anomaly_class=AnomalyClass.DIVERGENCE,
            ),
        )
    )
    monitor = SignalMonitor(config, trip_on=("custom:val_loss",))
    steps = [_obs(s, 2.0, custom={"val_loss": 2.9} if s % 50 == 0 else None) for s in range(200)]
    steps += [_obs(200, 2.0, custom={"val_loss": 3.3}), _obs(201, 2.0)]
    steps += [_obs(202, 2.0, custom={"val_loss": 3.4})]
    verdicts = _run(monitor, steps)
    assert [v.trip for v in verdicts[-3:]] == [False, False, True]
    (tripping,) = verdicts[-1].tripping
    assert tripping.signal == "custom:val_loss"
    assert tripping.onset_step == 200
    assert monitor.snapshot().custom == {"val_loss": 3.4}


def test_live_reconfigure_keeps_baselines_and_applies_new_thresholds() -> None:
    monitor = _default_monitor()
    _run(monitor, (_obs(s, v) for s, v in enumerate(_noisy(2.0, 400, seed=8))))
    assert not monitor.observe(_obs(400, 2.8)).findings  # 1.4x: below the default 1.6
    stricter = DetectionConfig(loss_spike=LossSpikeConfig(ratio=1.3, consecutive_steps=2))
    monitor.reconfigure(stricter, trip_on=DEFAULT_TRIP_ON)
    verdicts = _run(monitor, [_obs(401, 2.8), _obs(402, 2.8)])
    assert verdicts[-1].trip
    assert verdicts[-1].tripping[0].onset_step == 401


def test_state_survives_a_json_round_trip_and_continues_identically() -> None:
    losses = _noisy(2.0, 500, seed=10) + [4.0] * 6
    first = _default_monitor()
    for step, loss in enumerate(losses[:450]):
        first.observe(_obs(step, loss, tokens_per_second=5_000.0))
    saved = json.loads(json.dumps(first.state_dict()))
    second = _default_monitor()
    second.load_state_dict(saved)
    for step, loss in enumerate(losses[450:], start=450):
        obs = _obs(step, loss, tokens_per_second=5_000.0)
        assert first.observe(obs) == second.observe(obs)


def test_saved_state_keeps_the_layout_earlier_checkpoints_have() -> None:
    """Each signal writes its own keys now; together they must keep the flat version-1
    layout, or checkpoints written by earlier agents stop loading. A new signal may add a
    key (and must load without it); none of these may go or change shape."""
    custom = CustomSignalConfig(name="val_loss", kind=ThresholdKind.ABOVE, threshold=3.0)
    monitor = SignalMonitor(DetectionConfig(custom=(custom,)), trip_on=DEFAULT_TRIP_ON)
    for step in range(150):
        monitor.observe(_obs(step, 2.0, tokens_per_second=5_000.0, custom={"val_loss": 2.0}))
    state = monitor.state_dict()
    assert set(state) >= {
        "version",
        "loss",
        "grad_norm",
        "throughput",
        "custom",
        "non_finite",
        "non_finite_total",
        "last_good_step",
        "history",
    }
    assert state["version"] == 1
    assert set(state["loss"]) == set(state["grad_norm"]) == {"baseline", "streak"}
    assert set(state["throughput"]) == {"baseline", "streak", "steps_since_save"}
    assert set(state["custom"]) == {"val_loss"}
    assert set(state["custom"]["val_loss"]) == {"baseline", "streak"}


def test_corrupt_state_is_refused_and_leaves_the_monitor_untouched() -> None:
    monitor = _default_monitor()
    _run(monitor, (_obs(s, 2.0) for s in range(300)))
    before = monitor.state_dict()
    with pytest.raises(ValueError, match="version"):
        monitor.load_state_dict({"version": 99})
    broken = dict(before)
    del broken["grad_norm"]
    with pytest.raises(ValueError, match="grad_norm"):
        monitor.load_state_dict(broken)
    poisoned = json.loads(json.dumps(before))
    poisoned["loss"]["baseline"]["window"][0] = math.nan
    with pytest.raises(ValueError, match="non-finite"):
        monitor.load_state_dict(poisoned)
    assert monitor.state_dict() == before


def test_loss_climbing_with_an_anomalous_grad_norm_is_divergence() -> None:
    monitor = _default_monitor()
    observations = [_obs(s, v, 1.0) for s, v in enumerate(_noisy(2.0, 400, seed=12))]
    # Loss and grad norm break out together (no lead), and the loss keeps climbing.
    observations += [_obs(400 + i, 3.4 * (1.1**i), 6.0 * (1.2**i)) for i in range(6)]
    verdicts = _run(monitor, observations)
    assert verdicts[-1].trip
    first_loss_finding = next(f for f in verdicts[-4].findings if f.signal == LOSS)
    assert (
        first_loss_finding.anomaly_class is AnomalyClass.BAD_BATCH
    )  # onset alone: no evidence yet
    (tripping,) = verdicts[-1].tripping
    assert tripping.anomaly_class is AnomalyClass.DIVERGENCE
    assert "kept climbing" in tripping.evidence
    assert len(tripping.evidence) <= EVIDENCE_MAX


def test_relative_jump_custom_signal_learns_its_own_healthy_baseline() -> None:
    config = DetectionConfig(
        custom=(
            CustomSignalConfig(
                name="aux_loss",
                kind=ThresholdKind.RELATIVE_JUMP,
                threshold=3.0,
                consecutive_steps=2,
                anomaly_class=AnomalyClass.NUMERICAL,
            ),
        )
    )
    monitor = SignalMonitor(config, trip_on=())
    values = _noisy(0.01, 300, seed=13)
    verdicts = _run(monitor, (_obs(s, 2.0, custom={"aux_loss": v}) for s, v in enumerate(values)))
    assert [f for v in verdicts for f in v.findings] == []
    jumped = _run(monitor, [_obs(300 + i, 2.0, custom={"aux_loss": 0.05}) for i in range(3)])
    findings = [v.findings[0] for v in jumped]
    assert [f.sustained for f in findings] == [False, True, True]
    assert {f.anomaly_class for f in findings} == {AnomalyClass.NUMERICAL}
    assert findings[0].threshold == pytest.approx(0.03, rel=0.05)  # 3x the learned 0.01
    assert not any(v.trip for v in jumped)  # nothing named in trip_on: report only


def test_a_spike_right_after_the_warmup_trips_instead_of_becoming_the_baseline() -> None:
    config = DetectionConfig()
    warmup, seeds = config.baseline.warmup_steps, config.baseline.min_samples
    losses = _noisy(4.0, warmup, seed=7) + _noisy(2.5, 3, seed=8) + [7.0] * 12
    verdicts = _run(_default_monitor(), (_obs(s, v) for s, v in enumerate(losses)))
    last = verdicts[-1]
    assert last.trip, "a poisoned shard read while the baseline seeds must trip"
    (tripping,) = last.tripping
    assert tripping.signal == LOSS
    assert tripping.onset_step == warmup + 3 < warmup + seeds


def test_trip_rules_stop_only_where_the_first_matching_rule_stops() -> None:
    """Entropy low while reward rises rolls back (stops); entropy low alone only alerts: the
    agent trips on the first and keeps training on the second, as the operator's first
    match decides. A live edit of the rules changes it from the next step."""
    config = DetectionConfig(
        custom=(
            CustomSignalConfig(name="entropy", kind=ThresholdKind.BELOW, threshold=1.0),
            CustomSignalConfig(name="reward", kind=ThresholdKind.ABOVE, threshold=2.0),
        )
    )
    rules = (
        TripRule(on_signals=("custom:entropy",), while_firing=("custom:reward",), stops=True),
        TripRule(on_signals=("custom:entropy",), stops=False),
    )
    monitor = SignalMonitor(config, trip_on=("custom:entropy",), trip_rules=rules)
    alone = monitor.observe(_obs(201, 2.0, custom={"entropy": 0.5, "reward": 1.0}))
    assert [f.signal for f in alone.findings] == ["custom:entropy"]
    assert not alone.trip, "the first matching rule only alerts"
    both = monitor.observe(_obs(202, 2.0, custom={"entropy": 0.5, "reward": 3.0}))
    assert both.trip
    assert [f.signal for f in both.tripping] == ["custom:entropy"]
    only_trip_on = SignalMonitor(config, trip_on=("custom:entropy",))
    assert only_trip_on.observe(_obs(201, 2.0, custom={"entropy": 0.5, "reward": 1.0})).trip, (
        "without rules (an older operator) every signal in trip_on trips"
    )
    monitor.reconfigure(config, ("custom:entropy",), (TripRule(on_signals=("custom:entropy",),
                                                               stops=False),))  # fmt: skip
    assert not monitor.observe(_obs(203, 2.0, custom={"entropy": 0.5, "reward": 3.0})).trip
    classes = (TripRule(on_signals=("custom:entropy",), on_classes=(AnomalyClass.BAD_BATCH,),
                        stops=True),)  # fmt: skip
    monitor.reconfigure(config, ("custom:entropy",), classes)
    assert not monitor.observe(_obs(204, 2.0, custom={"entropy": 0.5})).trip, (
        "a Divergence finding matches no rule naming only BadBatch"
    )
