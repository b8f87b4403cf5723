"""The InvalidSpec condition: True with the problems while a job is held, False once its
spec became pods. Its Event is posted when it turns True or its message changes, never
again for the same problems, so a held job costs no API request until its spec changes."""

from __future__ import annotations

from collections.abc import Sequence

from stabletrain_operator.api.constants import ConditionType, Reason
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.conditions.entries import condition, set_condition
from stabletrain_operator.conditions.job import Stamp
from stabletrain_operator.tenancy.problems import SpecProblem, summary

ACCEPTED = "the spec became pods"


def held(
    status: StableTrainingJobStatus, problems: Sequence[SpecProblem], stamp: Stamp
) -> tuple[StableTrainingJobStatus, str | None]:
    """The status with InvalidSpec True, and the Event's message when it is news."""
    message = summary(problems)
    previous = condition(status.conditions, ConditionType.INVALID_SPEC)
    news = previous is None or previous.status != "True" or previous.message != message
    conditions = set_condition(
        status.conditions,
        ConditionType.INVALID_SPEC,
        True,
        problems[0].reason,
        message,
        now=stamp.now,
        generation=stamp.generation,
    )
    return status.model_copy(update={"conditions": conditions}), message if news else None


def accepted(status: StableTrainingJobStatus, stamp: Stamp) -> StableTrainingJobStatus:
    """InvalidSpec False once a launch goes ahead (absent stays absent)."""
    previous = condition(status.conditions, ConditionType.INVALID_SPEC)
    if previous is None or previous.status != "True":
        return status
    conditions = set_condition(
        status.conditions,
        ConditionType.INVALID_SPEC,
        False,
        Reason.SPEC_ACCEPTED,
        ACCEPTED,
        now=stamp.now,
        generation=stamp.generation,
    )
    return status.model_copy(update={"conditions": conditions})
