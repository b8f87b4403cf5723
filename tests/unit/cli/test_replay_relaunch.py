"""Recordings of runs that healed themselves: the step goes back at every relaunch. Replay
rebuilds the monitor of the new attempt from the surviving timeline, as the agent restores
it from the checkpoint, and decides once per real trip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from replay_histories import Row, history, write_csv

from stabletrain_operator.cli.main import main


def replay_json(
    capsys: pytest.CaptureFixture[str], metrics: Path, *options: str
) -> tuple[list[dict[str, Any]], str]:
    assert main(["replay", str(metrics), "--json", *options]) == 0
    captured = capsys.readouterr()
    return [json.loads(line) for line in captured.out.splitlines()], captured.err


def spiking(first: int, last: int) -> Any:
    def loss(step: int, healthy: float) -> float:
        return healthy * 2.2 if first <= step <= last else healthy

    return loss


def healed_run(*, second_spike: bool, attempt_column: bool) -> list[Row]:
    """Attempt 0 spikes at 3000 and trips at 3003; attempt 1 resumes after checkpoint 2900
    (the data around the onset skipped) and, if asked, spikes again at 3100."""
    first = history(range(0, 3004), loss=spiking(3000, 3003))
    second = history(
        range(2901, 4000),
        seed=8,
        loss=spiking(3100, 3200) if second_spike else spiking(-1, -1),
    )
    if attempt_column:
        for row in first:
            row["attempt"] = 0
        for row in second:
            row["attempt"] = 1
    return first + second


@pytest.mark.parametrize("attempt_column", [False, True])
def test_a_healed_run_replays_to_its_one_rollback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], attempt_column: bool
) -> None:
    rows = healed_run(second_spike=False, attempt_column=attempt_column)
    decisions, notes = replay_json(capsys, write_csv(tmp_path / "m.csv", rows))
    assert [(d["step"], d["signal"], d["action"], d["onset"]) for d in decisions] == [
        (3003, "LossSpike", "Rollback", 3000)
    ]
    assert "(steps 0-3999, 1 relaunches)" in notes


def test_a_recurrence_in_the_next_attempt_escalates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = healed_run(second_spike=True, attempt_column=False)
    decisions, _ = replay_json(capsys, write_csv(tmp_path / "m.csv", rows))
    assert [(d["step"], d["action"], d["reason"], d["escalation_level"]) for d in decisions] == [
        (3003, "Rollback", "RollbackStarted", 0),
        (3103, "Rollback", "Escalated", 1),
    ]
    assert decisions[1]["lr_scale"] == pytest.approx(0.125)


def test_the_new_attempt_starts_from_the_surviving_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A monitor started afresh at the relaunch would judge nothing for its first 100 steps
    (warm-up is in global steps, so not that) but would need min_samples again; one rebuilt
    from the timeline judges the very first rows, so a spike right after the resume trips
    at its fourth row."""
    first = history(range(0, 3004), loss=spiking(3000, 3003))
    second = history(range(2901, 3500), seed=8, loss=spiking(2901, 2950))
    decisions, _ = replay_json(capsys, write_csv(tmp_path / "m.csv", first + second))
    assert [(d["step"], d["onset"]) for d in decisions] == [(3003, 3000), (2904, 2901)]


def test_time_column_drives_the_cooldown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A grad-norm Alert rule, firing on a new episode 200 steps after its first Alert:
    inside a 300 s cooldown when each step takes a second, outside it when they take two."""
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "recovery:\n  rules:\n"
        "    - {name: grad, onSignals: [GradNormSpike], action: Alert}\n"
        "  budgets: {cooldownSeconds: 300}\n"
    )

    def grad(step: int) -> dict[str, float | str]:
        return {"grad_norm": 9.0} if 1000 <= step < 1010 or 1200 <= step < 1300 else {}

    for seconds_per_step, expected in ((1.0, [1003]), (2.0, [1003, 1203])):
        rows = history(range(2000), extra=grad)
        for row in rows:
            row["time"] = 1.7e9 + seconds_per_step * int(row["step"])
        decisions, _ = replay_json(
            capsys, write_csv(tmp_path / "m.csv", rows), "--policy", str(policy)
        )
        assert [d["step"] for d in decisions] == expected, seconds_per_step
