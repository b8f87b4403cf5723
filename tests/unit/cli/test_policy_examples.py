"""The policy examples in docs/policy.md are valid POLICY.yaml files and do what the text
says when replayed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from replay_histories import history, write_csv

from stabletrain_operator.api.cluster_policy import StableTrainingPolicy
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.cli.replay.history import read_history
from stabletrain_operator.cli.replay.policy_file import read_policy
from stabletrain_operator.cli.replay.replay_loop import replay
from stabletrain_operator.platform_policy.effective import effective_policy

DOC = Path(__file__).resolve().parents[3] / "docs" / "policy.md"
YAML = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
BLOCKS = [block for block in YAML if "\nkind: " not in block]
"""POLICY.yaml files; the others are Kubernetes objects."""


def test_the_doc_has_the_custom_signal_example() -> None:
    assert len(BLOCKS) == 1


def test_the_platform_policy_example_is_a_valid_stable_training_policy() -> None:
    (example,) = [yaml.safe_load(block) for block in YAML if "\nkind: " in block]
    policy = StableTrainingPolicy.model_validate(example)
    assert policy.spec.limits.max_rollbacks == 5
    job = StableTrainingJobSpec.model_validate(
        {
            "workers": {"template": {"spec": {"containers": [{"name": "t"}]}}},
            "checkpoints": {"local": {"hostPath": "/n"}, "pfs": {"claimName": "p"}},
        }
    )
    effective = effective_policy(job, [policy]).spec
    assert effective is not None
    assert effective.recovery.budgets.max_rollbacks == 3
    assert effective.detection.stall_seconds == 300


@pytest.fixture
def example_policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(BLOCKS[0])
    return path


def test_each_documented_custom_rule_fires_as_described(
    tmp_path: Path, example_policy: Path
) -> None:
    def custom(step: int) -> dict[str, float | str]:
        return {
            "val_loss": 3.0 * (1.2 if 1000 <= step < 1010 else 1.0),
            "moe_aux_loss": 0.15 if 1500 <= step < 1520 else 0.02,
            "entropy": 0.7 if 2500 <= step < 2600 or 3500 <= step < 3600 else 2.0,
            "reward": 1.0 * (1.3 if 2480 <= step < 2600 else 1.0),
        }

    metrics = write_csv(tmp_path / "m.csv", history(range(4000), extra=custom))
    result = replay(read_history(metrics), read_policy(example_policy))
    assert [(d.step, d.decision.rule, d.decision.action.value) for d in result.decisions] == [
        (1000, "validation-loss", "Alert"),
        (1504, "moe-aux-loss", "Alert"),
        (2502, "reward-hacking", "Rollback"),
        (3502, "entropy-low", "Alert"),
    ]
    assert result.decisions[2].decision.lr_scale == pytest.approx(0.25)
