"""Held models with the same field names point at one set of them; the set cannot change in
place, and copying a model still gives it names of its own to change."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest

from stabletrain_contract.directives import Directives
from stabletrain_operator.api.status import Condition, StableTrainingJobStatus
from stabletrain_operator.shared_field_names import SharedFieldNames, share_field_names


@dataclass
class Held:
    statuses: dict[str, StableTrainingJobStatus] = field(default_factory=dict)
    directives: list[Directives] = field(default_factory=list)


def status(step: int) -> StableTrainingJobStatus:
    return StableTrainingJobStatus.model_validate(
        {"phase": "Running", "step": step, "conditions": [
            {"type": "Ready", "status": "True", "reason": "Running", "message": "ok",
             "lastTransitionTime": "2026-12-04T00:00:00Z"},
        ]},
        context={"job": "job"},
    )  # fmt: skip


def test_models_with_the_same_names_share_one_set_through_dataclasses_dicts_and_lists() -> None:
    held = Held({"a": status(1), "b": status(2)}, [Directives(generation=1, attempt=0)])
    share_field_names(held)
    a, b = held.statuses["a"], held.statuses["b"]
    assert a.__pydantic_fields_set__ is b.__pydantic_fields_set__
    assert type(a.__pydantic_fields_set__) is SharedFieldNames
    assert a.conditions[0].__pydantic_fields_set__ is b.conditions[0].__pydantic_fields_set__
    assert type(held.directives[0].__pydantic_fields_set__) is SharedFieldNames
    assert a.model_fields_set == {"phase", "step", "conditions"}
    assert a == status(1)
    assert a.model_dump(exclude_unset=True, by_alias=True, mode="json") == status(1).model_dump(
        exclude_unset=True, by_alias=True, mode="json"
    )


def test_a_copy_gets_names_of_its_own_and_the_shared_set_refuses_changes() -> None:
    first, second = status(1), status(2)
    share_field_names([first, second])
    moved = first.model_copy(update={"attempt": 3})
    assert moved.model_fields_set == {"phase", "step", "conditions", "attempt"}
    assert first.model_fields_set == {"phase", "step", "conditions"}
    assert second.model_fields_set == {"phase", "step", "conditions"}
    assert type(copy.deepcopy(first).__pydantic_fields_set__) is set
    with pytest.raises(TypeError, match="shared"):
        first.attempt = 4
    assert second.model_fields_set == {"phase", "step", "conditions"}
    with pytest.raises(TypeError, match="shared"):
        first.__pydantic_fields_set__ |= {"x"}


def test_a_condition_held_alone_is_shared_too() -> None:
    condition = status(1).conditions[0]
    assert isinstance(condition, Condition)
    share_field_names((condition,))
    assert type(condition.__pydantic_fields_set__) is SharedFieldNames
