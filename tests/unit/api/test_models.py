"""The operator-side models refuse what the API server refuses, and the examples stay complete."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from stabletrain_operator.api.resource import StableTrainingJob
from stabletrain_operator.api.spec import StableTrainingJobSpec, default_rules
from stabletrain_operator.generate.crds import openapi_schema

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "manifests"


def minimal_spec() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / "minimal.yaml").read_text())["spec"]
    return loaded


def rule(**fields: Any) -> dict[str, Any]:
    return {"name": "r", "onSignals": ["LossSpike"], "action": "Rollback", **fields}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"workers": {"template": {"spec": {"containers": []}}}}, "at least one container"),
        (
            {
                "checkpoints": {
                    "local": {"hostPath": "/x", "volume": {"emptyDir": {}}},
                    "pfs": {"claimName": "c"},
                }
            },
            "exactly one of hostPath or volume",
        ),
        (
            {"checkpoints": {"local": {}, "pfs": {"claimName": "c"}}},
            "exactly one of hostPath or volume",
        ),
        (
            {"recovery": {"rules": [rule(onSignals=["custom:val"])]}},
            "detection.custom does not define",
        ),
        ({"recovery": {"rules": [rule(), rule()]}}, "repeated: r"),
        ({"recovery": {"rules": [rule(action="Alert", rollback={})]}}, "action is Rollback"),
        ({"recovery": {"rules": [rule(reduceLR={})]}}, "action is ReduceLR"),
        ({"recovery": {"rules": [rule(rollback={"lrFactor": 1.0})]}}, "less than 1"),
        (
            {
                "checkpoints": {
                    "local": {"hostPath": "/x", "sizeLimit": "lots"},
                    "pfs": {"claimName": "c"},
                }
            },
            "quantity",
        ),
        ({"detection": {"lossSpike": {"ratio": None}}}, "ratio, zscore or both"),
        (  # a plan holds 8: a ninth range was once accepted and silently dropped
            {
                "manualRollback": {
                    "requestId": "r1",
                    "skip": [{"first": n, "last": n} for n in range(9)],
                }
            },
            "at most 8 items",
        ),
    ],
)
def test_operator_side_validation_mirrors_the_server(changes: dict[str, Any], message: str) -> None:
    spec = minimal_spec()
    for key, value in changes.items():
        if key == "workers":
            spec["workers"] = {**spec["workers"], **value}
        else:
            spec[key] = value
    with pytest.raises(ValidationError, match=message):
        StableTrainingJobSpec.model_validate(spec)


def test_custom_signal_defined_in_detection_may_be_used() -> None:
    spec = minimal_spec()
    spec["detection"] = {"custom": [{"name": "val", "kind": "Above", "threshold": 3}]}
    spec["recovery"] = {"rules": [rule(onSignals=["custom:val"])]}
    parsed = StableTrainingJobSpec.model_validate(spec)
    assert parsed.recovery.rules[0].rollback_params().lr_factor == 0.5


def test_default_policy_is_ordered_and_covers_every_agent_signal() -> None:
    rules = default_rules()
    assert [r.name for r in rules] == ["non-finite", "loss-spike", "infrastructure", "report-only"]
    covered = {signal for r in rules for signal in r.on_signals}
    assert covered >= {"LossSpike", "NonFinite", "GradNormSpike", "ThroughputDrop", "WorkerFailure"}


def leaf_paths(schema: dict[str, Any], prefix: str) -> set[str]:
    properties = schema.get("properties") or schema.get("items", {}).get("properties")
    if not properties or schema.get("x-kubernetes-preserve-unknown-fields"):
        return {prefix}
    paths: set[str] = set()
    for name, child in properties.items():
        paths |= leaf_paths(child, f"{prefix}.{name}")
    return paths


def value_paths(value: Any, prefix: str) -> set[str]:
    if isinstance(value, dict) and value:
        return {p for k, v in value.items() for p in value_paths(v, f"{prefix}.{k}")}
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return {p for item in value for p in value_paths(item, prefix)}
    return {prefix}


def test_full_example_sets_every_spec_field() -> None:
    full = yaml.safe_load((EXAMPLES / "full.yaml").read_text())
    StableTrainingJob.model_validate(full)
    schema = openapi_schema()["properties"]["spec"]
    expected = leaf_paths(schema, "spec") - {"spec.checkpoints.local.volume"}
    present = {p for p in value_paths(full["spec"], "spec")}
    template_paths = {p for p in present if p.startswith("spec.workers.template")}
    assert expected - (present - template_paths) - {"spec.workers.template"} == set()
    assert "`volume:`" in (EXAMPLES / "full.yaml").read_text()


def test_manifest_round_trips_through_the_models() -> None:
    full = yaml.safe_load((EXAMPLES / "full.yaml").read_text())
    parsed = StableTrainingJob.model_validate(copy.deepcopy(full))
    again = StableTrainingJob.model_validate(parsed.model_dump(mode="json"))
    assert again == parsed


KEY_LINE = re.compile(r"^(\s*)(- )?([A-Za-z]+):")


def test_every_field_of_the_full_example_is_commented() -> None:
    """Each key outside the pod template's contents has a comment inline or just above it."""
    lines = (EXAMPLES / "full.yaml").read_text().splitlines()
    template_indent: int | None = None
    uncommented = []
    for index, line in enumerate(lines):
        match = KEY_LINE.match(line)
        if not match:
            continue
        indent = len(match.group(1)) + (2 if match.group(2) else 0)
        if template_indent is not None and indent > template_indent:
            continue
        template_indent = indent if match.group(3) == "template" else None
        if indent == 0 or (indent == 2 and match.group(3) in {"name", "spec"}):
            continue
        if "#" not in line and not lines[index - 1].lstrip().startswith("#"):
            uncommented.append(f"{index + 1}: {line.strip()}")
    assert uncommented == []
