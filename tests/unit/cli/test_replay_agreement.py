"""Replay must reach the decisions a live run reached: every case in replay_agreement/ (see
its README for the format) is replayed and compared key by key with what was recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stabletrain_operator.cli.replay.history import read_history
from stabletrain_operator.cli.replay.policy_file import default_policy, read_policy
from stabletrain_operator.cli.replay.replay_loop import replay
from stabletrain_operator.cli.replay.report import decision_record

CASES = sorted(p for p in (Path(__file__).parent / "replay_agreement").iterdir() if p.is_dir())


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_replay_agrees_with_the_recorded_decisions(case: Path) -> None:
    policy_path = case / "policy.yaml"
    policy = read_policy(policy_path) if policy_path.exists() else default_policy()
    result = replay(read_history(case / "metrics.csv"), policy)
    expected = [
        json.loads(line)
        for line in (case / "expected.jsonl").read_text().splitlines()
        if line.strip()
    ]
    replayed = [decision_record(d) for d in result.decisions]
    assert len(replayed) == len(expected), [(d["step"], d["action"]) for d in replayed]
    for got, want in zip(replayed, expected, strict=True):
        assert {key: got[key] for key in want} == want


def test_there_is_at_least_one_case() -> None:
    assert CASES, "replay_agreement/ holds no case"
