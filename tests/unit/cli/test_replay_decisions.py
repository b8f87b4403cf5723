"""Replay on synthetic histories: the decisions the agent's monitor and the policy engine
reach, read back from `stabletrain replay --json` exactly as a user would."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from replay_histories import history, write_csv

from stabletrain_operator.cli.main import main
from stabletrain_operator.cli.replay.history import read_history
from stabletrain_operator.cli.replay.policy_file import default_policy
from stabletrain_operator.cli.replay.replay_loop import PROGRESS_EVERY, replay

Decisions = list[dict[str, Any]]


def replay_json(
    capsys: pytest.CaptureFixture[str], metrics: Path, *options: str
) -> tuple[Decisions, str]:
    code = main(["replay", str(metrics), "--json", *options])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    decisions = [json.loads(line) for line in captured.out.splitlines()]
    return decisions, captured.err


def policy_file(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_sustained_spike_yields_one_rollback_at_the_fourth_anomalous_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = history(
        range(4000), loss=lambda s, healthy: healthy * 2.3 if 3000 <= s < 3200 else healthy
    )
    decisions, notes = replay_json(capsys, write_csv(tmp_path / "m.csv", rows))
    assert [(d["step"], d["signal"], d["action"], d["onset"]) for d in decisions] == [
        (3003, "LossSpike", "Rollback", 3000)
    ]
    assert decisions[0]["rule"] == "loss-spike"
    assert decisions[0]["skip"] == [[2950, 3250]]
    assert decisions[0]["lr_scale"] == pytest.approx(0.5)
    assert "1 decision" in notes


def test_one_step_outliers_yield_no_rollback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outliers = {900: 1.5, 1700: 2.5, 2600: 4.0}
    rows = history(range(3000), loss=lambda s, healthy: healthy * outliers.get(s, 1.0))
    decisions, _ = replay_json(capsys, write_csv(tmp_path / "m.csv", rows))
    assert decisions == []


def test_nan_yields_a_rollback_whose_onset_is_the_nan_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = history(range(2000), loss=lambda s, healthy: math.nan if s >= 1500 else healthy)
    metrics = write_csv(tmp_path / "m.csv", rows)
    decisions, _ = replay_json(capsys, metrics)
    assert [(d["step"], d["signal"], d["action"], d["onset"]) for d in decisions] == [
        (1502, "NonFinite", "Rollback", 1500)
    ], "the default waits for 3 non-finite steps in a row (isolated overflows are routine)"
    strict = policy_file(tmp_path / "p.yaml", "detection:\n  nonFinite:\n    consecutiveSteps: 1\n")
    decisions, _ = replay_json(capsys, metrics, "--policy", strict)
    assert [(d["step"], d["signal"], d["action"]) for d in decisions] == [
        (1500, "NonFinite", "Rollback")
    ]


def test_empty_and_inf_loss_cells_are_non_finite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cells = {1200: "", 1201: "inf", 1202: "-Infinity", 1203: "NaN"}
    rows = history(range(1500), loss=cells.get)
    decisions, _ = replay_json(capsys, write_csv(tmp_path / "m.csv", rows))
    assert [(d["step"], d["signal"], d["onset"]) for d in decisions] == [(1202, "NonFinite", 1200)]


def test_slow_noisy_decline_yields_no_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = history(range(20_000), noise=0.05, seed=11)
    decisions, notes = replay_json(capsys, write_csv(tmp_path / "m.csv", rows))
    assert decisions == []
    assert "0 decisions" in notes


def test_sparse_rows_count_logged_rows_as_consecutive_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = history(
        range(0, 8000, 10), loss=lambda s, healthy: healthy * 2.0 if 5000 <= s < 5600 else healthy
    )
    decisions, _ = replay_json(capsys, write_csv(tmp_path / "m.csv", rows))
    assert [(d["step"], d["action"], d["onset"]) for d in decisions] == [(5030, "Rollback", 5000)]


def test_a_recurrence_near_the_onset_escalates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def two_spikes(step: int, healthy: float) -> float:
        spiking = 3000 <= step < 3100 or 3400 <= step < 3500
        return healthy * 2.2 if spiking else healthy

    decisions, _ = replay_json(
        capsys, write_csv(tmp_path / "m.csv", history(range(4000), loss=two_spikes))
    )
    assert [(d["step"], d["reason"], d["escalation_level"]) for d in decisions] == [
        (3003, "RollbackStarted", 0),
        (3403, "Escalated", 1),
    ]
    assert decisions[1]["lr_scale"] == pytest.approx(0.5 * 0.25)
    assert decisions[1]["skip"] == [[3300, 3900]]


def test_a_spent_budget_fails_the_job_and_stops_the_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def spikes(step: int, healthy: float) -> float:
        return healthy * 2.2 if step in range(1000, 1100) or step in range(3000, 3100) else healthy

    policy = policy_file(tmp_path / "p.yaml", "recovery:\n  budgets:\n    maxRollbacks: 1\n")
    metrics = write_csv(tmp_path / "m.csv", history(range(5000), loss=spikes))
    decisions, notes = replay_json(capsys, metrics, "--policy", policy)
    assert [(d["step"], d["action"], d["reason"]) for d in decisions] == [
        (1003, "Rollback", "RollbackStarted"),
        (3003, "Fail", "RollbackBudgetExhausted"),
    ]
    assert "would have failed at step 3003" in notes


CUSTOM_POLICY = """\
detection:
  custom:
    - name: val_loss_jump
      metric: val_loss
      kind: RelativeJump
      threshold: 1.15
    - name: entropy_low
      metric: entropy
      kind: Below
      threshold: 1.0
      consecutiveSteps: 3
    - name: reward_jump
      metric: reward
      kind: Above
      threshold: 0.8
recovery:
  rules:
    - name: reward-hacking
      onSignals: [custom:entropy_low]
      whileFiring: [custom:reward_jump]
      action: Rollback
      rollback: {lrFactor: 0.25}
    - name: val-loss
      onSignals: [custom:val_loss_jump]
      action: Alert
"""


def test_custom_signal_columns_drive_their_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def custom(step: int) -> dict[str, float | str]:
        val = 3.0 * (1.3 if 1500 <= step < 1520 else 1.0)
        entropy = 0.8 if step >= 2500 else 2.0
        reward = 0.9 if step >= 2490 else 0.5
        return {"val_loss": val, "entropy": entropy, "reward": reward, "unused_col": 1.0}

    metrics = write_csv(tmp_path / "m.csv", history(range(3000), extra=custom))
    policy = policy_file(tmp_path / "p.yaml", CUSTOM_POLICY)
    decisions, notes = replay_json(capsys, metrics, "--policy", policy)
    assert [(d["step"], d["signal"], d["action"], d["rule"]) for d in decisions] == [
        (1500, "custom:val_loss_jump", "Alert", "val-loss"),
        (2502, "custom:entropy_low", "Rollback", "reward-hacking"),
    ]
    assert decisions[1]["lr_scale"] == pytest.approx(0.25)
    assert "unused_col" in notes


def test_entropy_low_without_reward_rising_only_restarts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def custom(step: int) -> dict[str, float | str]:
        return {"val_loss": 3.0, "entropy": 0.8 if step >= 2500 else 2.0, "reward": 0.5}

    metrics = write_csv(tmp_path / "m.csv", history(range(3000), extra=custom))
    policy = policy_file(tmp_path / "p.yaml", CUSTOM_POLICY)
    decisions, _ = replay_json(capsys, metrics, "--policy", policy)
    assert decisions == [], (
        "the compound is unmet and no other rule takes entropy_low: the agent keeps training "
        "(its directives' trip rules say the first match would not stop) and it is recorded"
    )


def test_json_mode_prints_nothing_but_json_objects_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = history(range(2000), loss=lambda s, healthy: math.nan if s >= 1500 else healthy)
    decisions, notes = replay_json(capsys, write_csv(tmp_path / "m.csv", rows))
    assert decisions
    for decision in decisions:
        assert {"step", "signal", "action", "rule", "reason", "class", "onset"} <= set(decision)
    assert "replaying 2000 rows" in notes


def test_text_mode_explains_each_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = history(
        range(4000), loss=lambda s, healthy: healthy * 2.3 if 3000 <= s < 3200 else healthy
    )
    assert main(["replay", str(write_csv(tmp_path / "m.csv", rows))]) == 0
    out = capsys.readouterr().out
    assert "step 3003: Rollback by rule loss-spike [RollbackStarted] on LossSpike" in out
    assert "skip steps 2950-3250; target checkpoint <= 2900" in out
    assert "evidence: loss" in out


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = history(
        range(1500), loss=lambda s, healthy: healthy * 2.3 if 1000 <= s < 1100 else healthy
    )
    out = tmp_path / "replay.png"
    replay_json(capsys, write_csv(tmp_path / "m.csv", rows), "--plot", str(out))
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 10_000


def test_progress_is_reported_every_so_many_rows(tmp_path: Path) -> None:
    rows = history(range(2 * PROGRESS_EVERY + 5))
    seen: list[tuple[int, int]] = []
    replay(
        read_history(write_csv(tmp_path / "m.csv", rows)),
        default_policy(),
        on_progress=lambda done, total: seen.append((done, total)),
    )
    assert seen == [(PROGRESS_EVERY, len(rows)), (2 * PROGRESS_EVERY, len(rows))]


def test_anomalies_that_began_before_a_rollback_are_not_decided_on_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def spike(step: int, healthy: float) -> float:
        return healthy * 2.2 if 3000 <= step < 3100 else healthy

    def grad_norm(step: int) -> dict[str, float | str]:
        return {"grad_norm": 9.0} if 3002 <= step < 3060 else {}

    rows = history(range(4000), loss=spike, extra=grad_norm)
    decisions, _ = replay_json(capsys, write_csv(tmp_path / "m.csv", rows))
    assert [(d["step"], d["signal"], d["action"]) for d in decisions] == [
        (3003, "LossSpike", "Rollback")
    ], "the grad-norm spike from step 3002 belongs to the run the rollback stopped"
    later = history(
        range(4000), loss=spike, extra=lambda s: {"grad_norm": 9.0} if 3500 <= s < 3560 else {}
    )
    decisions, _ = replay_json(capsys, write_csv(tmp_path / "later.csv", later))
    assert [(d["step"], d["signal"], d["action"]) for d in decisions] == [
        (3003, "LossSpike", "Rollback"),
        (3503, "GradNormSpike", "Alert"),
    ]
