"""Equal policy parts of different jobs are validated once and held as one object
(api/shared.py); what differs, or is read differently, stays apart."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from stabletrain_contract.base import AS_WRITTEN
from stabletrain_operator.api import shared
from stabletrain_operator.api.spec import RecoverySpec, StableTrainingJobSpec

SPEC: dict[str, Any] = {
    "workers": {"nodes": 2, "template": {"spec": {"containers": [{"name": "trainer"}]}}},
    "checkpoints": {"local": {"hostPath": "/var/lib/stabletrain"}, "pfs": {"claimName": "pfs"}},
    "recovery": {"restart": "InPlace", "warmStart": True},
}


def _spec(raw: dict[str, Any], **context: object) -> StableTrainingJobSpec:
    return StableTrainingJobSpec.model_validate(copy.deepcopy(raw), context=context or None)


def test_two_jobs_with_one_policy_hold_one_object_of_each_part() -> None:
    first, second = _spec(SPEC), _spec(SPEC)
    assert first.recovery is second.recovery
    assert first.checkpoints is second.checkpoints
    assert first.workers is not second.workers, "the pods' template is not shared"


def test_a_different_part_is_its_own_object_and_the_rest_is_still_shared() -> None:
    other = copy.deepcopy(SPEC)
    other["recovery"]["warmStart"] = False
    first, second = _spec(SPEC), _spec(other)
    assert first.recovery is not second.recovery
    assert second.recovery.warm_start is False
    assert first.checkpoints is second.checkpoints


def test_an_input_read_as_written_is_not_taken_for_one_read_as_stored() -> None:
    assert _spec(SPEC, **{AS_WRITTEN: True}).recovery is not _spec(SPEC).recovery
    assert _spec(SPEC, **{AS_WRITTEN: True}).recovery is _spec(SPEC, **{AS_WRITTEN: True}).recovery


def test_a_model_given_as_a_model_is_kept_as_it_is() -> None:
    mine = RecoverySpec(warm_start=False)
    spec = StableTrainingJobSpec.model_validate({**SPEC, "recovery": mine})
    assert spec.recovery is mine


def test_an_invalid_part_is_refused_every_time_and_never_remembered() -> None:
    bad = {**SPEC, "recovery": {"restart": "Sometimes"}}
    before = shared.remembered()
    for _ in range(2):
        with pytest.raises(ValidationError, match=r"recovery\.restart"):
            _spec(bad)
    assert shared.remembered() == before


def test_the_oldest_input_is_forgotten_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """More distinct policies than SHARED_MAX share less; each is still validated right."""
    monkeypatch.setattr(shared, "SHARED_MAX", 2)
    monkeypatch.setattr(shared, "_validated", {})
    modes = ("InPlace", "RecreatePods")
    specs = [_spec({**SPEC, "recovery": {"restart": mode}}) for mode in modes]
    assert shared.remembered() <= 2
    again = _spec({**SPEC, "recovery": {"restart": "InPlace"}})
    assert again.recovery == specs[0].recovery
    assert again.recovery is not specs[0].recovery, "forgotten, validated anew"
    assert shared.remembered() <= 2
