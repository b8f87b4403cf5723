"""How a spec edit reaches the running pods, and what status.observedGeneration means.

The policy in force (status.policy) is what the running pods apply and what the operator
decides by: its detection and trip list are in the pods' directives, its checkpoint settings
in their managers, its rules judge what they report. An edit that changes nothing the pods
apply (budgets, escalation, placement, a rule's action on a signal that only reports) is in
force at once. An edit that does (detection, which signals trip, custom signals, checkpoint
settings) is sent as live directives of a new generation and comes into force when every
pod of the attempt reports that generation, or a trip report shows the ranks tripped under
it; until then the pods' trips and the operator's decisions follow the previous policy, so
a trip that raced the edit is decided by the rules that made the agent trip. With no pod
running (Pending, a stop, a relaunch, suspended) the next launch carries the newest spec and
it is in force at once. A spec the job's StableTrainingPolicy limits refuse never comes into
force. An edit of spec.workers (the template, the rendezvous), checkpoints.memory,
recovery.restart or recovery.warmStart reaches pods only when they are created: it waits for
the next attempt.

status.observedGeneration is the newest generation all of whose changes are in force, and
the SpecApplied condition says what waits and why.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.checkpoint.settings import CheckpointSettings
from stabletrain_contract.detection import DetectionConfig
from stabletrain_contract.directives import Directives
from stabletrain_contract.trip_rules import TripRule
from stabletrain_operator.api.constants import ConditionType, Phase, Reason
from stabletrain_operator.api.policy_in_force import BuiltFrom, PolicyInForce, PolicyRollout
from stabletrain_operator.api.quantity import quantity_bytes
from stabletrain_operator.api.spec import RecoverySpec, StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.conditions.entries import condition, set_condition
from stabletrain_operator.conditions.preflight_condition import Notice
from stabletrain_operator.observe.pod_facts import PodFacts, PodState
from stabletrain_operator.observe.scrape import ScrapeResult
from stabletrain_operator.plan.sent_directives import (
    checkpoint_settings,
    live_directives,
    trip_rules,
    with_spec,
)
from stabletrain_operator.platform_policy.effective import EffectivePolicy
from stabletrain_operator.policy import trip_signals
from stabletrain_operator.policy.trips import reported_trips

RUNNING_PHASES = frozenset({Phase.RUNNING, Phase.CONFIRMING})
"""Phases whose pods run the attempt: an edit of what they apply is sent to them."""
DIGEST_CHARS = 16


class Tick(Protocol):
    """What rollout reads of a reconcile tick (the state machine's World passes as it is)."""

    @property
    def now(self) -> datetime: ...

    @property
    def generation(self) -> int | None: ...

    @property
    def pods(self) -> tuple[PodFacts, ...]: ...

    @property
    def scrapes(self) -> tuple[ScrapeResult, ...]: ...


def _digest(payload: object) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def _pods_part(
    detection: DetectionConfig,
    trip_on: Sequence[str],
    rules: Sequence[TripRule] | None,
    checkpoints: CheckpointSettings | None,
) -> dict[str, object]:
    return {
        "detection": detection.model_dump(mode="json"),
        "tripOn": list(trip_on),
        "tripRules": None if rules is None else [r.model_dump(mode="json") for r in rules],
        "checkpoints": None if checkpoints is None else checkpoints.model_dump(mode="json"),
    }


def _recovery_part(
    detection: DetectionConfig, recovery: RecoverySpec, checkpoints: CheckpointSettings
) -> dict[str, object]:
    return _pods_part(detection, trip_signals(recovery), trip_rules(recovery), checkpoints)


def pods_digest(spec: StableTrainingJobSpec) -> str:
    """Digest of what `spec` tells the pods: detection, trip list and rules, checkpoint
    settings."""
    return _digest(_recovery_part(spec.detection, spec.recovery, checkpoint_settings(spec)))


def record_digest(record: PolicyInForce) -> str:
    """The same digest of a policy in force."""
    return _digest(_recovery_part(record.detection, record.recovery, record.checkpoints))


def directives_digest(directives: Directives) -> str:
    """The same digest of what directives tell the pods."""
    return _digest(
        _pods_part(
            directives.detection, directives.trip_on, directives.trip_rules, directives.checkpoints
        )
    )


def built_digest(spec: StableTrainingJobSpec) -> str:
    """Digest of what reaches a pod only when it is created: spec.workers (the template, the
    rendezvous), the memory tier's interval (the pod's environment and volume) and the
    restart settings (the supervisor's wrap and its warm start)."""
    return _digest(
        {
            "workers": spec.workers.model_dump(mode="json", by_alias=True),
            "memory": spec.checkpoints.memory.model_dump(mode="json", by_alias=True),
            "restart": spec.recovery.restart.value,
            "warmStart": spec.recovery.warm_start,
        }
    )


def record_of(
    effective: EffectivePolicy,
    spec: StableTrainingJobSpec,
    *,
    generation: int | None,
    directives_generation: int,
) -> PolicyInForce:
    """status.policy for `spec` (the effective spec), with its provenance."""
    return PolicyInForce(
        spec_generation=generation,
        directives_generation=directives_generation,
        policies=effective.policies,
        sources=effective.sources,
        detection=spec.detection,
        recovery=spec.recovery,
        checkpoints=checkpoint_settings(spec),
    )


def in_force_spec(spec: StableTrainingJobSpec, record: PolicyInForce) -> StableTrainingJobSpec:
    """`spec` with the policy in force: its detection, recovery and checkpoint settings."""
    settings = record.checkpoints
    checkpoints = spec.checkpoints
    local = checkpoints.local.model_copy(update={"retention": settings.keep_local})
    written = checkpoints.local.size_limit
    if settings.local_size_limit_bytes != (None if written is None else quantity_bytes(written)):
        local = local.model_copy(update={"size_limit": settings.local_size_limit_bytes})
    checkpoints = checkpoints.model_copy(
        update={
            "interval_steps": settings.interval_steps,
            "spike_markers": settings.spike_markers,
            "local": local,
            "pfs": checkpoints.pfs.model_copy(update={"retention": settings.keep_pfs}),
        }
    )
    return spec.model_copy(
        update={
            "detection": record.detection,
            "recovery": record.recovery,
            "checkpoints": checkpoints,
        }
    )


def _fresh(status: StableTrainingJobStatus, tick: Tick) -> list[AgentStatus]:
    return [
        r.status
        for r in tick.scrapes
        if r.status is not None and r.status.attempt == status.attempt
    ]


def _acknowledged(status: StableTrainingJobStatus, generation: int, tick: Tick, nodes: int) -> bool:
    """Every pod of the attempt reports `generation` (or newer), or the ranks tripped under
    it (they adopt directives together, so one report speaks for all)."""
    fresh = _fresh(status, tick)
    current = [p for p in tick.pods if p.attempt == status.attempt]
    trips = reported_trips(current, fresh, status.attempt)
    if any((t.directives_generation or 0) >= generation for t in trips):
        return True
    applied = {s.node_rank for s in fresh if s.applied_generation >= generation}
    return len(applied) >= nodes


def take_in_force(
    status: StableTrainingJobStatus,
    tick: Tick,
    *,
    spec: StableTrainingJobSpec,
    target: EffectivePolicy,
) -> tuple[StableTrainingJobStatus, StableTrainingJobSpec]:
    """The status with the policy in force this tick, and the spec the machine acts by.

    `spec` is the job's (the effective one when `target` admits it). An edit sent to the
    pods comes into force when they acknowledged it; one that changes nothing they apply,
    at once. Before the first launch (no policy recorded) the newest admitted spec is it.
    """
    record = status.policy
    admitted = target.spec
    if record is None:
        return status, admitted or spec
    rollout = status.policy_rollout
    if rollout is not None and _acknowledged(
        status, rollout.policy.directives_generation, tick, spec.workers.nodes
    ):
        record = rollout.policy
        status = status.model_copy(update={"policy": record, "policy_rollout": None})
        rollout = None
    if rollout is None and admitted is not None and record_digest(record) == pods_digest(admitted):
        current = record_of(
            target,
            admitted,
            generation=tick.generation,
            directives_generation=record.directives_generation,
        )
        if current != record:
            status = status.model_copy(update={"policy": current})
        record = current
    return status, in_force_spec(admitted or spec, record)


def directives_base(
    status: StableTrainingJobStatus, attempt: Directives | None, *, in_force: StableTrainingJobSpec
) -> Directives | None:
    """The attempt's directives carrying what the pods should run now: the edit on its way
    to them while there is one, else the spec in force."""
    if attempt is None:
        return None
    rollout = status.policy_rollout
    if rollout is None:
        return with_spec(attempt, in_force)
    return with_spec(attempt, in_force_spec(in_force, rollout.policy))


@dataclass(frozen=True)
class Settled:
    """The tick's status with the policy, observedGeneration and SpecApplied settled, and a
    live directive to send when an edit goes out."""

    status: StableTrainingJobStatus
    live: Directives | None
    live_pods: tuple[str, ...]
    notices: tuple[Notice, ...] = ()


@dataclass(frozen=True)
class Handled:
    """What the phase's handler did this tick that rollout must know."""

    launched: Directives | None
    """The directives of pods it launched (they start with that content)."""
    live: Directives | None
    """A live directive it sends (a ReduceLR, a suspend's save request, a retry)."""
    live_pods: tuple[str, ...]


def settle(
    before: StableTrainingJobStatus,
    after: StableTrainingJobStatus,
    tick: Tick,
    *,
    spec: StableTrainingJobSpec,
    target: EffectivePolicy,
    base: Directives | None,
    handled: Handled,
) -> Settled:
    """After the phase's handler: send an edit to the running pods, put it in force where
    no pod has to apply it, record what the pods were built from, and say so."""
    status = after
    live, live_pods = handled.live, handled.live_pods
    if handled.launched is not None:
        launched_from = BuiltFrom(spec_generation=tick.generation, digest=built_digest(spec))
        status = status.model_copy(update={"built_from": launched_from})
    pods_run = status.phase in RUNNING_PHASES and handled.launched is None
    sent: tuple[Notice, ...] = ()
    if target.spec is not None:
        if pods_run:
            status, live, live_pods, sent = _send(
                status, tick, target, base, live=live, live_pods=live_pods
            )
        else:
            status = _without_pods(status, tick, target, handled.launched)
        built = status.built_from
        same = built is not None and built.digest == built_digest(target.spec)
        if built is not None and same and built.spec_generation != tick.generation:
            built = built.model_copy(update={"spec_generation": tick.generation})
            status = status.model_copy(update={"built_from": built})
    status, notices = _say(before, status, tick, target, pods_run)
    return Settled(status, live, live_pods, (*sent, *notices))


def _without_pods(
    status: StableTrainingJobStatus,
    tick: Tick,
    target: EffectivePolicy,
    launched: Directives | None,
) -> StableTrainingJobStatus:
    """No pod runs the attempt (or its pods start this tick): the newest spec is in force,
    unless the pods just launched carry an older one (an edit in the very tick of the
    launch), which the next tick then sends them."""
    admitted = target.spec
    assert admitted is not None
    if launched is not None and directives_digest(launched) != pods_digest(admitted):
        return status
    directives = launched.generation if launched is not None else status.directives_generation
    record = record_of(target, admitted, generation=tick.generation,
                       directives_generation=directives)  # fmt: skip
    if status.policy == record and status.policy_rollout is None:
        return status
    return status.model_copy(update={"policy": record, "policy_rollout": None})


def _send(
    status: StableTrainingJobStatus,
    tick: Tick,
    target: EffectivePolicy,
    base: Directives | None,
    *,
    live: Directives | None,
    live_pods: tuple[str, ...],
) -> tuple[StableTrainingJobStatus, Directives | None, tuple[str, ...], tuple[Notice, ...]]:
    """The running pods' share of an edit, sent as the next directives generation (or with
    the one the handler sends anyway, when it already carries the edit)."""
    admitted = target.spec
    assert admitted is not None
    wanted = pods_digest(admitted)
    record, rollout = status.policy, status.policy_rollout
    if record is None:  # an operator before status.policy: its pods run what the spec says
        record = record_of(target, admitted, generation=tick.generation,
                           directives_generation=status.directives_generation)  # fmt: skip
        return status.model_copy(update={"policy": record}), live, live_pods, ()
    if rollout is not None and record_digest(rollout.policy) == wanted:
        return status, live, live_pods, ()  # sent; the lagging pods get it again each round
    if rollout is None and record_digest(record) == wanted:
        return status, live, live_pods, ()
    if status.save_request is not None or base is None:
        return status, live, live_pods, ()  # a suspend's save first: the relaunch carries it
    if live is not None and directives_digest(live) == wanted:
        sending = live.generation
    else:
        sending = status.directives_generation + 1
        live = live_directives(with_spec(base, admitted), generation=sending,
                               lr_scale=status.lr_scale)  # fmt: skip
    pods = {p.name for p in tick.pods if p.attempt == status.attempt and p.ip
            and p.state is PodState.RUNNING}  # fmt: skip
    policy = record_of(target, admitted, generation=tick.generation,
                       directives_generation=sending)  # fmt: skip
    rollout = PolicyRollout(sent_at=tick.now, policy=policy)
    status = status.model_copy(update={"directives_generation": sending, "policy_rollout": rollout})
    message = (
        f"spec generation {tick.generation} changes what the pods run "
        f"({_changes(record, admitted)}): directives generation {sending} sent to "
        f"{len(pods)} pod(s); it is in force once every pod applied it"
    )
    notice = Notice("Normal", Reason.AWAITING_PODS.value, message)
    return status, live, tuple(sorted({*live_pods, *pods})), (notice,)


def _changes(record: PolicyInForce, spec: StableTrainingJobSpec) -> str:
    """Which of the pods' parts an edit changes, in words."""
    parts = []
    before, after = trip_signals(record.recovery), trip_signals(spec.recovery)
    if before != after:
        parts.append(
            f"trip on {', '.join(after) or 'nothing'}, was {', '.join(before) or 'nothing'}"
        )
    if record.detection != spec.detection:
        parts.append("detection thresholds")
    if record.checkpoints != checkpoint_settings(spec):
        parts.append("checkpoint settings")
    return "; ".join(parts)


def _say(
    before: StableTrainingJobStatus,
    status: StableTrainingJobStatus,
    tick: Tick,
    target: EffectivePolicy,
    pods_run: bool,
) -> tuple[StableTrainingJobStatus, tuple[Notice, ...]]:
    """observedGeneration and the SpecApplied condition, and an Event when they change."""
    generation = tick.generation
    record, rollout, built = status.policy, status.policy_rollout, status.built_from
    held = record.spec_generation if record is not None else None
    admitted = target.spec
    if admitted is None:
        keeps = (
            f"the pods and the operator keep the policy of generation {held}"
            if record is not None
            else "no pod is started"
        )
        ok, reason, observed = False, target.reason or Reason.EXCEEDS_POLICY_LIMIT, held
        message = f"spec generation {generation} is not in force: {target.refusal}; {keeps}"
    elif pods_run and (rollout is not None or record is None or
                       record_digest(record) != pods_digest(admitted)):  # fmt: skip
        ok, reason, observed = False, Reason.AWAITING_PODS, held
        if rollout is not None:
            sent = rollout.policy.directives_generation
            waits = (
                f"directives generation {sent} sent at {rollout.sent_at:%H:%M:%S}, not yet "
                "reported applied by every pod"
            )
        else:
            waits = "it is sent once the suspend's final checkpoint is saved"
        message = (
            f"spec generation {generation} changes what the pods run; {waits}; until every "
            f"pod applies it, the policy of generation {held} is in force (the pods' trips "
            "and the operator's decisions follow it)"
        )
    elif pods_run and built is not None and built.spec_generation != generation:
        ok, reason, observed = False, Reason.AT_NEXT_ATTEMPT, built.spec_generation
        message = (
            f"spec generation {generation} changes what reaches pods only when they are "
            "created (spec.workers, checkpoints.memory, recovery.restart or warmStart): it "
            f"takes effect at attempt {status.attempt + 1}; the pods of "
            f"attempt {status.attempt} were built from generation {built.spec_generation}"
        )
    else:
        ok, reason, observed = True, Reason.SPEC_IN_FORCE, generation
        message = (
            f"the pods run spec generation {generation} (directives generation "
            f"{status.directives_generation})"
            if pods_run
            else f"spec generation {generation} is in force; pods started from now on run it"
        )
    previous = condition(before.conditions, ConditionType.SPEC_APPLIED)
    conditions = set_condition(
        status.conditions, ConditionType.SPEC_APPLIED, ok, reason, message,
        now=tick.now, generation=generation,
    )  # fmt: skip
    status = status.model_copy(update={"conditions": conditions, "observed_generation": observed})
    # An Event when what the condition says changes kind (an edit sent is announced by the
    # sending itself; a refusal of a new spec generation is announced too).
    changed = previous.reason != reason.value if previous is not None else not ok
    refused = not ok and reason not in (Reason.AWAITING_PODS, Reason.AT_NEXT_ATTEMPT)
    if refused and previous is not None and before.observed_generation != observed:
        changed = True
    if not changed or reason is Reason.AWAITING_PODS:
        return status, ()
    return status, (Notice("Warning" if refused else "Normal", reason.value, message),)
