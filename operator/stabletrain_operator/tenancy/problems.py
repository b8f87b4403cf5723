"""A reason a job's spec cannot become pods, naming the field a person has to fix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stabletrain_operator.api.constants import Reason

MESSAGE_MAX = 1024
"""An Event's message is cut there by kube.event; the condition gets the same text."""


@dataclass(frozen=True)
class SpecProblem:
    field: str
    """Path in the StableTrainingJob, as kubectl explain spells it (`spec.checkpoints.local.
    hostPath`, `spec.workers.template.spec.containers[0].env`, `metadata.name`)."""
    reason: Reason
    message: str

    def describe(self) -> str:
        return f"{self.field}: {self.message}"


def summary(problems: Sequence[SpecProblem]) -> str:
    """One sentence per problem, the condition's and the Event's message."""
    return "; ".join(p.describe() for p in problems)[:MESSAGE_MAX]
