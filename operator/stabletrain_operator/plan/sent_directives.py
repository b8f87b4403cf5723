"""The Directives of an attempt, and the live ones sent to its running pods.

Generation grows with every decision, whether it reaches the pods in a new attempt's
ConfigMap or live over HTTP; the agent applies only newer generations, so a retried PUT or
a stale ConfigMap can never undo a newer decision.
"""

from __future__ import annotations

from collections.abc import Sequence

from stabletrain_agent.contract.directives import Directives, SkipRange
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.policy import trip_signals


def attempt_directives(
    spec: StableTrainingJobSpec,
    *,
    generation: int,
    attempt: int,
    resume_step: int | None,
    lr_scale: float,
    rewarmup_steps: int,
    skip: Sequence[SkipRange],
) -> Directives:
    """Everything attempt `attempt` starts with; the detection and trip list from the spec."""
    return Directives(
        generation=generation,
        attempt=attempt,
        resume_step=resume_step,
        lr_scale=lr_scale,
        rewarmup_steps=rewarmup_steps if resume_step is not None else 0,
        skip=tuple(skip),
        detection=spec.detection,
        trip_on=trip_signals(spec.recovery),
    )


def live_directives(
    base: Directives, *, generation: int, lr_scale: float, save_request: int | None = None
) -> Directives:
    """The attempt's directives with a new LR scale (what a ReduceLR PUTs to every pod) and,
    before a suspend, the request for a checkpoint now.

    Resume step and skip list stay those of the attempt (the agent refuses a live change
    of the resume step); the re-warm-up continues from the same resume step.
    """
    update: dict[str, object] = {"generation": generation, "lr_scale": lr_scale}
    if save_request is not None:
        update["save_request"] = save_request
    return base.model_copy(update=update)
