"""The final numbers of an attempt that ran to its end, from its pods' completion messages.

A scrape is seconds older than the step it shows, and none follows a pod's exit: without
these messages a finished job kept the step and loss of its last scrape (290 of 300 steps).
"""

from __future__ import annotations

from collections.abc import Sequence

from stabletrain_operator.api.status import StableTrainingJobStatus, rounded_loss
from stabletrain_operator.observe.pod_facts import PodFacts, PodState


def with_final_numbers(
    status: StableTrainingJobStatus, pods: Sequence[PodFacts]
) -> StableTrainingJobStatus:
    """The status with the step and loss the attempt's succeeded pods stated on their way out,
    the loss as the lowest rank saw it (like a scrape's); unchanged when none stated them (a
    script that never closed its guard, an agent older than the operator)."""
    completions = [
        pod.completion
        for pod in sorted(pods, key=lambda p: p.rank)
        if pod.state is PodState.SUCCEEDED
        and pod.completion is not None
        and pod.completion.attempt == status.attempt
    ]
    if not completions:
        return status
    return status.model_copy(
        update={
            "step": max(c.step for c in completions),
            "loss": rounded_loss(completions[0].loss),
        }
    )
