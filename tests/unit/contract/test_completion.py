"""The completion message: what a pod that trained to its end tells the operator."""

from __future__ import annotations

import math

import pytest

from stabletrain_contract.completion import Completion, parse_completion, render_completion
from stabletrain_contract.restore import render_restore_failure


@pytest.mark.parametrize("loss", [2.538881301879883, 1e-05, 12345.678, None])
def test_the_final_step_and_loss_come_back_exactly(loss: float | None) -> None:
    completion = Completion(step=300, attempt=2, loss=loss)
    message = render_completion(completion)
    assert message.startswith("TrainingComplete: step 300 of attempt 2, loss ")
    assert parse_completion(message) == completion


def test_a_non_finite_loss_is_stated_as_such() -> None:
    parsed = parse_completion(render_completion(Completion(step=7, attempt=0, loss=math.nan)))
    assert parsed is not None
    assert parsed.loss is not None
    assert math.isnan(parsed.loss)


@pytest.mark.parametrize(
    "message",
    [
        "",
        '{"signal": "NonFinite"}',
        render_restore_failure(50, 2, "no restorable checkpoint of step 50"),
        "TrainingComplete: step 300 of attempt 2, loss two",
        "TrainingComplete: step 300",
    ],
)
def test_any_other_message_is_not_a_completion(message: str) -> None:
    assert parse_completion(message) is None
