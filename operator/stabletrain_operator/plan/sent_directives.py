"""The Directives of an attempt, and the live ones sent to its running pods.

Generation grows with every decision and every spec edit the pods must apply, whether it
reaches them in a new attempt's ConfigMap or live over HTTP; the agent applies only newer
generations, so a retried PUT or a stale ConfigMap can never undo a newer decision.

What the spec says to the pods (its detection, the trip list its rules give, its checkpoint
settings) is taken from the spec each time directives are built, never copied from the
attempt's first ones: a live directive carries the spec in force now.
"""

from __future__ import annotations

from collections.abc import Sequence

from stabletrain_contract.checkpoint.settings import CheckpointSettings
from stabletrain_contract.directives import Directives, SkipRange
from stabletrain_contract.names import AGENT_SIGNALS, CUSTOM_SIGNAL_PREFIX
from stabletrain_contract.trip_rules import TripRule
from stabletrain_operator.api.quantity import quantity_bytes
from stabletrain_operator.api.spec import RecoverySpec, StableTrainingJobSpec
from stabletrain_operator.policy import trip_signals
from stabletrain_operator.policy.action_registry import kind_of


def checkpoint_settings(spec: StableTrainingJobSpec) -> CheckpointSettings:
    """spec.checkpoints' interval and retentions, as the running manager applies them."""
    checkpoints = spec.checkpoints
    limit = checkpoints.local.size_limit
    return CheckpointSettings(
        interval_steps=checkpoints.interval_steps,
        keep_local=checkpoints.local.retention,
        keep_pfs=checkpoints.pfs.retention,
        spike_markers=checkpoints.spike_markers,
        local_size_limit_bytes=None if limit is None else quantity_bytes(limit),
    )


def trip_rules(recovery: RecoverySpec) -> tuple[TripRule, ...]:
    """The rules in order, as far as the agent's signals go: the agent stops on a sustained
    finding exactly when the first of them matching it stops the run, as the operator's
    own first match would decide (contract/trip_rules.py)."""
    rules = []
    for rule in recovery.rules:
        signals = tuple(
            s for s in rule.on_signals if s.startswith(CUSTOM_SIGNAL_PREFIX) or s in AGENT_SIGNALS
        )
        if signals:
            rules.append(
                TripRule(
                    on_signals=signals,
                    on_classes=rule.on_classes,
                    while_firing=rule.while_firing,
                    stops=kind_of(rule.action).stops_the_run,
                )
            )
    return tuple(rules)


def spec_content(spec: StableTrainingJobSpec) -> dict[str, object]:
    """The Directives fields the spec decides (the pods' share of an edit), by field name."""
    return {
        "detection": spec.detection,
        "trip_on": trip_signals(spec.recovery),
        "trip_rules": trip_rules(spec.recovery),
        "checkpoints": checkpoint_settings(spec),
    }


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
    """Everything attempt `attempt` starts with; detection, trip list and checkpoint
    settings from the spec."""
    return Directives(
        generation=generation,
        attempt=attempt,
        resume_step=resume_step,
        lr_scale=lr_scale,
        rewarmup_steps=rewarmup_steps if resume_step is not None else 0,
        skip=tuple(skip),
        detection=spec.detection,
        trip_on=trip_signals(spec.recovery),
        trip_rules=trip_rules(spec.recovery),
        checkpoints=checkpoint_settings(spec),
    )


def with_spec(base: Directives, spec: StableTrainingJobSpec) -> Directives:
    """The attempt's directives carrying `spec`'s detection, trip list and checkpoint
    settings: the base every live directive of the attempt is made from."""
    return base.model_copy(update=spec_content(spec))


def live_directives(
    base: Directives, *, generation: int, lr_scale: float, save_request: int | None = None
) -> Directives:
    """`base` (the attempt's directives with the spec in force, `with_spec`) with a new LR
    scale (what a ReduceLR PUTs to every pod) and, before a suspend, the request for a
    checkpoint now.

    Resume step and skip list stay those of the attempt (the agent refuses a live change
    of the resume step); the re-warm-up continues from the same resume step.
    """
    update: dict[str, object] = {"generation": generation, "lr_scale": lr_scale}
    if save_request is not None:
        update["save_request"] = save_request
    return base.model_copy(update=update)
