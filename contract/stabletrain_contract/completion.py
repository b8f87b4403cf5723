"""The termination message of a pod whose training ran to its end: the final step and loss.

The operator learns a run's progress from scrapes seconds apart (further apart while the
job is healthy), so a run that ended between two of them kept the step and loss of the last
scrape as its final ones (`kubectl get stj` said 290 for a run of 300 steps). Each pod's
local rank 0 leaves this message when training ends without an error, and the operator
takes the final numbers from it once every pod succeeded. Plain text with a fixed prefix,
like the restore failure's (JSON is the trip report's form), so that `kubectl describe pod`
reads as a sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COMPLETE_PREFIX = "TrainingComplete"
UNKNOWN_LOSS = "unknown"
_PATTERN = re.compile(rf"^{COMPLETE_PREFIX}: step (\d+) of attempt (\d+), loss (\S+)$")


@dataclass(frozen=True)
class Completion:
    step: int
    """The last optimizer step the pod's ranks finished."""
    attempt: int
    loss: float | None
    """The loss of that step, averaged over ranks; None when no step of this process
    reported one (every step was restored, none trained)."""


def render_completion(completion: Completion) -> str:
    """`TrainingComplete: step N of attempt A, loss L`, the loss with every digit."""
    loss = UNKNOWN_LOSS if completion.loss is None else repr(completion.loss)
    return f"{COMPLETE_PREFIX}: step {completion.step} of attempt {completion.attempt}, loss {loss}"


def parse_completion(message: str) -> Completion | None:
    """The completion a message states; None for any other message."""
    match = _PATTERN.match(message.strip())
    if match is None:
        return None
    step, attempt, loss = match.groups()
    if loss == UNKNOWN_LOSS:
        return Completion(int(step), int(attempt), None)
    try:
        return Completion(int(step), int(attempt), float(loss))
    except ValueError:
        return None
