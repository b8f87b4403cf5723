"""metav1.Condition bookkeeping: one entry per type, lastTransitionTime moves only on a flip.

A condition whose status did not change keeps its transition time even when the reason or
message is refreshed; that is what lets a person read "Healthy has been False since ...".
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from stabletrain_operator.api.constants import ConditionType, Reason
from stabletrain_operator.api.status import Condition


def set_condition(
    conditions: Sequence[Condition],
    kind: ConditionType,
    status: bool,
    reason: Reason | str,
    message: str,
    *,
    now: datetime,
    generation: int | None,
) -> tuple[Condition, ...]:
    """`conditions` with `kind` set; the others unchanged, in their order."""
    wanted = "True" if status else "False"
    previous = next((c for c in conditions if c.type == kind.value), None)
    changed = previous is None or previous.status != wanted
    updated = Condition(
        type=kind.value,
        status=wanted,
        observed_generation=generation,
        last_transition_time=now if changed or previous is None else previous.last_transition_time,
        reason=str(reason),
        message=message[:32_768],
    )
    if previous is None:
        return (*conditions, updated)
    return tuple(updated if c.type == kind.value else c for c in conditions)


def condition(conditions: Sequence[Condition], kind: ConditionType) -> Condition | None:
    return next((c for c in conditions if c.type == kind.value), None)
