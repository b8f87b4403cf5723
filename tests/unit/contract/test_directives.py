"""Directives survive the wire unchanged and refuse what the agent could not honour."""

from __future__ import annotations

import json

import pytest

from stabletrain_contract.base import ContractError
from stabletrain_contract.checkpoint.settings import CheckpointSettings
from stabletrain_contract.detection import CustomSignalConfig, DetectionConfig, ThresholdKind
from stabletrain_contract.directives import (
    DEFAULT_TRIP_ON,
    Directives,
    SkipRange,
    SkipUnit,
    parse_directives,
)
from stabletrain_contract.trip_rules import TripRule


def rich_directives() -> Directives:
    return Directives(
        generation=7,
        attempt=3,
        resume_step=31_000,
        lr_scale=0.25,
        rewarmup_steps=200,
        skip=(
            *(
                SkipRange(first=31_000 + 500 * i, last=31_200 + 500 * i, shard_ids=(f"shard-{i}",))
                for i in range(200)
            ),
            SkipRange(first=5, last=9, unit=SkipUnit.BATCH),
        ),
        detection=DetectionConfig(
            custom=(CustomSignalConfig(name="val_loss", kind=ThresholdKind.ABOVE, threshold=3.2),)
        ),
        trip_on=("LossSpike", "NonFinite", "custom:val_loss"),
        trip_rules=(
            TripRule(on_signals=("custom:val_loss",), while_firing=("LossSpike",), stops=True),
            TripRule(on_signals=("LossSpike", "NonFinite"), stops=False),
        ),
        checkpoints=CheckpointSettings(
            interval_steps=25, keep_local=8, keep_pfs=8, spike_markers=2, local_size_limit_bytes=10
        ),
    )


def test_round_trip_is_exact() -> None:
    original = rich_directives()
    assert parse_directives(original.to_json()) == original


def test_wire_format_is_camel_case_and_leaves_defaults_out() -> None:
    """A field at its default is not sent: an agent older than the field still reads the
    directives as long as no decision set it (docs/operations.md, "Version skew")."""
    wire = json.loads(rich_directives().to_json())
    assert {"resumeStep", "lrScale", "rewarmupSteps", "tripOn"} <= wire.keys()
    assert wire["skip"][0] == {"first": 31_000, "last": 31_200, "shardIds": ["shard-0"]}
    assert wire["skip"][-1] == {"first": 5, "last": 9, "unit": "Batch"}
    assert wire["detection"] == {
        "custom": [{"name": "val_loss", "kind": "Above", "threshold": 3.2}]
    }
    assert "saveRequest" not in wire
    assert json.loads(Directives(generation=1, attempt=0).to_json()) == {
        "generation": 1,
        "attempt": 0,
    }


def test_minimal_directives_get_documented_defaults() -> None:
    directives = parse_directives('{"generation": 1, "attempt": 0}')
    assert directives.lr_scale == 1.0
    assert directives.resume_step is None
    assert directives.trip_on == DEFAULT_TRIP_ON
    assert directives.detection == DetectionConfig()
    assert (directives.trip_rules, directives.checkpoints) == (None, None), (
        "an operator before these fields: trip_on trips, the pod's env keeps the settings"
    )


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"generation": 0, "attempt": 0}, "generation"),
        ({"generation": 1, "attempt": 0, "lrScale": 1.5}, "lrScale"),
        ({"generation": 1, "attempt": 0, "lrScale": 0}, "lrScale"),
        ({"generation": 1, "attempt": 0, "lrScal": 0.5}, "lrScal"),
        ({"generation": 1, "attempt": 0, "skip": [{"first": 9, "last": 3}]}, "skip.0"),
        ({"generation": 1, "attempt": 0, "tripOn": ["LossSpik"]}, "tripOn"),
        ({"generation": 1, "attempt": 0, "tripOn": ["WorkerFailure"]}, "tripOn"),
        ({"generation": 1, "attempt": 0, "tripOn": ["custom:val_loss"]}, "(root)"),
        (
            {"generation": 1, "attempt": 0, "detection": {"lossSpike": {"ratio": 0.9}}},
            "detection.lossSpike.ratio",
        ),
        (
            {
                "generation": 1,
                "attempt": 0,
                "checkpoints": {
                    "intervalSteps": 5,
                    "keepLocal": 1,
                    "keepPfs": 3,
                    "spikeMarkers": 0,
                },
            },
            "checkpoints.keepLocal",
        ),
        (
            {"generation": 1, "attempt": 0, "tripRules": [{"onSignals": [], "stops": True}]},
            "tripRules.0.onSignals",
        ),
    ],
)
def test_bad_directives_name_the_field(payload: dict[str, object], field: str) -> None:
    with pytest.raises(ContractError) as caught:
        parse_directives(json.dumps(payload))
    assert f"  {field}:" in str(caught.value)


def test_not_json_is_a_contract_error() -> None:
    with pytest.raises(ContractError, match="invalid directives"):
        parse_directives(b"\xff{")


def test_skip_range_length_is_inclusive() -> None:
    assert SkipRange(first=10, last=10).length == 1
