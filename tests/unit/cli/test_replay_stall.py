"""A per-step `time` column lets replay reach the operator's Stalled decisions, with the
operator's own stall rule: a gap over the bound, never during warm-up or after a stop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from replay_histories import Row, history, write_csv

from stabletrain_operator.cli.main import main

T0 = 1.7e9


def replay_json(
    capsys: pytest.CaptureFixture[str], metrics: Path, *options: str
) -> list[dict[str, Any]]:
    assert main(["replay", str(metrics), "--json", *options]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def timed(steps: range, start: float, *, gap_after: dict[int, float] | None = None) -> list[Row]:
    """Rows 0.5 s apart from `start`, with extra seconds after the steps named."""
    rows = history(steps)
    at = start
    for row in rows:
        row["time"] = at
        at += 0.5 + (gap_after or {}).get(int(row["step"]), 0.0)
    return rows


def policy(tmp_path: Path, stall: int | None) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(
        "detection: {}\n" if stall is None else f"detection: {{stallSeconds: {stall}}}\n"
    )
    return path


def test_a_gap_over_stall_seconds_is_stalled_at_the_last_completed_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = timed(range(1, 61), T0, gap_after={29: 30.0})
    decisions = replay_json(capsys, write_csv(tmp_path / "m.csv", rows),
                            "--policy", str(policy(tmp_path, 5)))  # fmt: skip
    assert [(d["step"], d["signal"], d["action"], d["rule"]) for d in decisions] == [
        (29, "Stalled", "RestartFromLatest", "infrastructure")
    ]
    assert (
        "no rank completed a step for 30.5 s (bound 5 s) after step 29"
        in (decisions[0]["evidence"])
    )
    slow = timed(range(1, 61), T0, gap_after=dict.fromkeys(range(1, 61), 4.0))
    slow_run = write_csv(tmp_path / "s.csv", slow)
    assert replay_json(capsys, slow_run, "--policy", str(policy(tmp_path, 5))) == [], "slow"


def test_warm_up_rows_and_the_gap_after_a_stop_are_not_stalls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    warm = timed(range(1, 40), T0, gap_after={1: 60.0})
    assert replay_json(capsys, write_csv(tmp_path / "w.csv", warm),
                       "--policy", str(policy(tmp_path, 5))) == []  # fmt: skip

    def spike(step: int, healthy: float) -> float:
        return healthy * 2.2 if 3000 <= step <= 3003 else healthy

    first = history(range(0, 3004), loss=spike)
    second = history(range(2901, 3100), seed=8)
    at = T0
    for row in first + second:
        at += 60.0 if row is second[0] else 0.5
        row["time"] = at
    decisions = replay_json(capsys, write_csv(tmp_path / "r.csv", first + second),
                            "--policy", str(policy(tmp_path, 5)))  # fmt: skip
    assert [(d["step"], d["signal"]) for d in decisions] == [(3003, "LossSpike")]


def test_the_default_bound_is_sized_from_the_recorded_step_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = timed(range(1, 60), T0, gap_after={30: 100.0})
    short_run = write_csv(tmp_path / "a.csv", short)
    assert replay_json(capsys, short_run, "--policy", str(policy(tmp_path, None))) == []
    hung = timed(range(1, 60), T0, gap_after={30: 130.0})
    decisions = replay_json(capsys, write_csv(tmp_path / "b.csv", hung),
                            "--policy", str(policy(tmp_path, None)))  # fmt: skip
    assert [(d["step"], d["signal"]) for d in decisions] == [(30, "Stalled")]


def test_a_relaunch_after_a_silent_gap_is_reached_as_the_live_operator_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The e2e hang recording's shape: attempt 0 stops after step 29 with no decision in
    the metrics, attempt 1 resumes from checkpoint 20 after the stall and the relaunch."""
    first = timed(range(1, 30), T0)
    second = timed(range(21, 61), float(first[-1]["time"]) + 25.0)
    for attempt, rows in ((0, first), (1, second)):
        for row in rows:
            row["attempt"] = attempt
    decisions = replay_json(capsys, write_csv(tmp_path / "h.csv", first + second),
                            "--policy", str(policy(tmp_path, 5)))  # fmt: skip
    assert [(d["step"], d["signal"], d["action"]) for d in decisions] == [
        (29, "Stalled", "RestartFromLatest")
    ]
