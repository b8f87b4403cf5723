"""The job's state machine: Pending -> Running, and every action that needs the attempt's
processes ended as Stopping -> Planning -> Relaunching -> Confirming -> Running (or Failed,
Suspended).

`advance` is a pure function of the persisted status and what was observed this tick; it
returns the next status and the side effects around its write. The daemon performs the
`launch` before writing (creates are idempotent by name, so a crash before the write only
repeats them), writes the status once, and only then deletes pods, PUTs live directives and
emits Events. Every phase derives its effects from the persisted status alone, so an
operator killed anywhere and restarted repeats at most an idempotent effect and finishes
the same action exactly once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.directives import Directives, SkipRange
from stabletrain_contract.names import Action, Signal
from stabletrain_contract.supervisor import SupervisorReport
from stabletrain_contract.trip_report import TripReport
from stabletrain_operator import naming
from stabletrain_operator.api.constants import SKIPS_PER_ACTION, ConditionType, Phase, Reason
from stabletrain_operator.api.spec import (
    CrashLoopAction,
    PreflightMode,
    RestartMode,
    StableTrainingJobSpec,
    UnschedulableAction,
)
from stabletrain_operator.api.status import (
    CHOICE_MAX,
    EXCLUDED_MAX,
    HISTORY_MAX,
    REPLACED_LISTED_MAX,
    SKIP_RANGES_INLINE_MAX,
    Counters,
    Plan,
    RollbackRecord,
    StableTrainingJobStatus,
    rounded_loss,
)
from stabletrain_operator.conditions.entries import condition
from stabletrain_operator.conditions.job import (
    CREATED_SUSPENDED,
    FAILED_BY_POLICY,
    FAILED_NO_PODS,
    NO_SIGNAL_FIRES,
    NO_SIGNAL_YET,
    RELAUNCHING_AFTER_SUSPEND,
    SUSPENDED_NO_PODS,
    clear_healthy,
    clear_ready,
    clear_recovering,
    clear_suspended,
    set_budget_exhausted,
    set_complete,
    set_failed,
    set_healthy,
    set_ready,
    set_recovering,
    set_suspended,
)
from stabletrain_operator.conditions.preflight_condition import (
    Notice,
    PreflightPodResult,
    from_running_pods,
    gate,
)
from stabletrain_operator.finite import finite_or
from stabletrain_operator.observe.pod_facts import PodFacts, PodState
from stabletrain_operator.observe.read_completion import with_final_numbers
from stabletrain_operator.observe.scrape import ScrapeResult
from stabletrain_operator.observe.stall import RankProgress
from stabletrain_operator.plan.checkpoint import (
    choose_checkpoint,
    no_checkpoint_decision,
    step_bound,
    surviving_memory,
)
from stabletrain_operator.plan.confirm import Outcome, confirm_step, confirmation
from stabletrain_operator.plan.in_place import (
    Split,
    keepable,
    lagging_starts,
    must_replace,
    nodes_to_leave,
    repeat_leaves_the_node,
    split,
    stopped,
)
from stabletrain_operator.plan.merged_inventory import merged_inventory, without_abandoned
from stabletrain_operator.plan.placement import avoided_nodes, remember_suspects, unexpired
from stabletrain_operator.plan.rollout import Handled, directives_base, settle, take_in_force
from stabletrain_operator.plan.sent_directives import attempt_directives, live_directives
from stabletrain_operator.plan.skips import merge_skip_ranges, skipping_repeat_suspects
from stabletrain_operator.platform_policy.effective import EffectivePolicy
from stabletrain_operator.pods import grace_seconds, pod_shape, supervised
from stabletrain_operator.policy import (
    Decision,
    Deferral,
    Observation,
    PolicyLedger,
    evaluate,
    record,
)
from stabletrain_operator.policy.action_kind import ActionKind, Relaunch, StatusCounter
from stabletrain_operator.policy.action_registry import LIVE_ACTION_REASONS, kind_of
from stabletrain_operator.policy.crashloop import crash_loop
from stabletrain_operator.policy.decision_records import history_entry, stopping_plan
from stabletrain_operator.policy.incident import Incident, gather_observations
from stabletrain_operator.policy.skip_wording import describe_skip
from stabletrain_operator.policy.trips import pod_trips
from stabletrain_operator.queue import state as queue_state
from stabletrain_operator.queue.admission import Admission, Placement
from stabletrain_operator.scheduling import said, stuck_pods

STOP_FORCE_MARGIN = timedelta(seconds=10)
"""Pods still present this long after their grace period ran out are deleted with grace 0:
a lost node never confirms a graceful deletion. Pods whose node the control plane already
marked as silent (PodFacts.node_silent) do not wait for this."""


def stop_force_after(spec: StableTrainingJobSpec) -> timedelta:
    """How long after Stopping began a pod that is still there gets force-deleted."""
    return timedelta(seconds=grace_seconds(spec)) + STOP_FORCE_MARGIN


SUSPEND_SAVE = timedelta(seconds=120)
"""How long spec.suspend waits for the pods' final checkpoint before it stops them anyway
(the agent gives the PFS copy 60 s of it)."""
RESUME_RULE = "resume"
"""Rule name of the relaunch after `suspend` is cleared; counts against no budget."""
RESTART_BACKOFF_MAX = timedelta(seconds=30)
"""Restarts wait 1, 2, 4 ... s (capped) after the decision: a node or a dependency that just
failed gets a moment, and a crash loop cannot burn the restart budget in seconds. The
doubling runs over recoveries in a row, each decided less than this after the one before:
attempts that ran longer already space the restarts as the cap would, so their restart
waits the least. Counted over the job's life, a long run's fifth restart in a day waited
16 s, each one idling every node of the job."""


def restart_backoff(in_a_row: int) -> timedelta:
    """Delay before relaunching the `in_a_row`-th recovery of a run (1-based)."""
    return min(timedelta(seconds=2 ** max(in_a_row - 1, 0)), RESTART_BACKOFF_MAX)


def recoveries_in_a_row(history: Sequence[RollbackRecord], decided_at: datetime) -> int:
    """The place of the recovery decided at `decided_at` in its run: 1, plus each stopping
    action before it decided less than RESTART_BACKOFF_MAX before the next (live actions
    in the history do not count)."""
    in_a_row, later = 1, decided_at
    for entry in reversed(history):
        if not kind_of(entry.action).stops_the_run:
            continue
        if later - entry.time >= RESTART_BACKOFF_MAX:
            break
        in_a_row, later = in_a_row + 1, entry.time
    return in_a_row


@dataclass(frozen=True)
class World:
    """What the daemon observed this tick, next to the persisted status."""

    now: datetime
    job: str
    """The job's name (names of the objects it owns)."""
    spec: StableTrainingJobSpec
    generation: int | None
    """metadata.generation of the spec read this tick."""
    pods: tuple[PodFacts, ...]
    """Every worker pod of the job that exists, of any attempt."""
    scrapes: tuple[ScrapeResult, ...] = ()
    """This tick's scrapes of the current attempt's pods (empty between scrapes)."""
    skip_ranges: tuple[SkipRange, ...] = ()
    """The full skip list in force (read from the spill ConfigMap when status has one)."""
    ledger: PolicyLedger = field(default_factory=PolicyLedger)
    previous_nodes: tuple[str | None, ...] = ()
    """Node of each rank in the last attempt whose placement is known (index = rank)."""
    attempt_directives: Directives | None = None
    """The current attempt's initial directives (its ConfigMap), base of live directives."""
    preflight_pod: PreflightPodResult | None = None
    """A Refuse-mode job's preflight pod while Pending (None: not read this tick)."""
    progress: tuple[RankProgress, ...] = ()
    """Newest heartbeat of each running pod of the current attempt (empty between scrapes)."""
    supervisors: Mapping[str, SupervisorReport] = field(default_factory=dict)
    """The newest report of each supervised pod's supervisor (by pod name)."""
    handed_over: tuple[AgentStatus, ...] = ()
    """This tick's statuses of pods whose supervisor answered for an absent training agent:
    their checkpoints, scanned on disk, join the inventory."""
    admission: Admission | None = None
    """The job's Kueue admission (queue/admission.py); None for a job not queued, whose
    pods start at once."""
    target: EffectivePolicy | None = None
    """The newest spec generation under the job's StableTrainingPolicy objects, or why they
    refuse it; None: `spec` as it is (no policy). `advance` puts `spec` to the policy in
    force (plan/rollout.py) before any phase acts."""


@dataclass(frozen=True)
class Launch:
    """Create the directives ConfigMap, then the pods of `directives.attempt`."""

    directives: Directives
    preferred_nodes: tuple[str | None, ...]
    spill_skip_ranges: tuple[SkipRange, ...] | None = None
    """The full skip list for the spill ConfigMap, when it no longer fits status."""
    avoid_nodes: tuple[str, ...] = ()
    """Suspect nodes the pods keep away from (recovery.placement)."""
    avoid_required: bool = True
    """Required anti-affinity when enough other nodes are there, else only preferred;
    False: always only preferred."""
    in_place: tuple[tuple[int, str], ...] = ()
    """(rank, pod) of the pods kept from the stopped attempt: relabelled to this attempt
    and told to start it; only the other ranks get new pods."""
    placement: Placement | None = None
    """The admitted Kueue flavors' node labels and tolerations (a queued job only)."""


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Transition:
    """The next status and the effects around its write: what one reconcile tick moves the
    job to (named apart from a training step, which status counts in `step`)."""

    status: StableTrainingJobStatus
    ledger: PolicyLedger
    launch: Launch | None = None
    delete_pods: tuple[str, ...] = ()
    force_delete: bool = False
    stop_pods: tuple[str, ...] = ()
    """Supervised pods told to stop the processes of `stop_attempt` (after the write)."""
    stop_attempt: int = 0
    start_pods: tuple[str, ...] = ()
    """Supervised pods of the current attempt told (again) to start it (after the write)."""
    live: Directives | None = None
    live_pods: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()
    decision: Decision | None = None
    recovered_after: timedelta | None = None
    """Detection -> relaunched pods, for the recovery-duration histogram."""
    deferred: tuple[Deferral, ...] = ()
    """Why each firing signal set aside this tick changed nothing, for the daemon's log."""


def advance(status: StableTrainingJobStatus, world: World) -> Transition:
    """One transition (or none) of the job, as a pure function."""
    before = status
    target = world.target or EffectivePolicy(world.spec)
    status, spec = take_in_force(status, world, spec=world.spec, target=target)
    base = directives_base(status, world.attempt_directives, in_force=spec)
    world = dataclasses.replace(world, spec=spec, attempt_directives=base, target=target)
    status = _expire_suspects(status, world)
    handler = _HANDLERS[status.phase]
    transition = handler(status, world)
    if world.admission is not None:  # what Kueue did comes first: it caused the rest
        queued, notices = queue_state.observed(transition.status, world, world.admission)
        queue_events = tuple(Event(n.type, n.reason, n.message) for n in notices)
        transition = dataclasses.replace(
            transition, status=queued, events=(*queue_events, *transition.events)
        )
    reported = from_running_pods(
        transition.status,
        world.spec,
        [r.status for r in world.scrapes if r.status is not None],
        now=world.now,
        generation=world.generation,
    )
    final = reported.status.model_copy(update={"policy_ledger": transition.ledger.to_status()})
    launched = transition.launch.directives if transition.launch is not None else None
    handled = Handled(launched, transition.live, transition.live_pods)
    settled = settle(before, final, world, spec=spec, target=target, base=base, handled=handled)
    return dataclasses.replace(
        transition,
        status=settled.status,
        live=settled.live,
        live_pods=settled.live_pods,
        events=(*transition.events, *_events(reported.notices), *_events(settled.notices)),
    )


def _expire_suspects(status: StableTrainingJobStatus, world: World) -> StableTrainingJobStatus:
    kept = unexpired(status.suspect_nodes, world.now)
    if kept == status.suspect_nodes:
        return status
    return status.model_copy(update={"suspect_nodes": kept})


def _events(notices: Sequence[Notice]) -> tuple[Event, ...]:
    return tuple(Event(n.type, n.reason, n.message) for n in notices)


def _recorded(status: StableTrainingJobStatus, entry: RollbackRecord) -> StableTrainingJobStatus:
    """status with one more decision in its bounded history (oldest dropped)."""
    history = (*status.rollback_history, entry)[-HISTORY_MAX:]
    return status.model_copy(update={"rollback_history": history})


def _live_record(
    status: StableTrainingJobStatus, world: World, decision: Decision
) -> RollbackRecord:
    """A decision that launches nothing (ReduceLR, Alert) as a history entry."""
    return history_entry(
        decision,
        time=world.now,
        reached_step=status.step,
        lr_scale=status.lr_scale,
        attempt=status.attempt,
    )


def _may_run(world: World) -> bool:
    """No queue, or Kueue admitted the job and wants nothing back: pods may be created."""
    return world.admission is None or world.admission.may_run


def _placement(world: World) -> Placement | None:
    return world.admission.placement if world.admission is not None else None


@dataclass(frozen=True)
class _Hold:
    """Why a running job saves a final checkpoint and stops without a fault."""

    cause: str
    """The sentence's subject: spec.suspend, or Kueue's eviction with its reason."""
    saving: Reason
    stopped: Reason


def _hold(world: World) -> _Hold | None:
    if world.spec.suspend:
        return _Hold("spec.suspend is true", Reason.SAVING_BEFORE_SUSPEND, Reason.SUSPENDED)
    admission = world.admission
    if admission is not None and admission.eviction is not None:
        eviction = admission.eviction
        cause = f"Kueue evicted the job ({eviction.reason}: {eviction.message[:300]})"
        return _Hold(cause, Reason.EVICTED, Reason.EVICTED)
    return None


# --- Pending --------------------------------------------------------------------------------


def _pending(status: StableTrainingJobStatus, world: World) -> Transition:
    if world.target is not None and world.target.spec is None:
        return Transition(status, world.ledger)  # refused by its policies: SpecApplied says why
    if world.spec.suspend:
        suspended = set_suspended(
            status.model_copy(update={"phase": Phase.SUSPENDED}),
            world,
            reason=Reason.SUSPENDED,
            message=CREATED_SUSPENDED,
        )
        return Transition(suspended, world.ledger)
    if not _may_run(world):
        return Transition(status, world.ledger)  # queued: the Admitted condition says why
    preflight_events: tuple[Event, ...] = ()
    if world.spec.preflight.mode is PreflightMode.REFUSE:
        checked = gate(
            status, world.spec, world.preflight_pod, now=world.now, generation=world.generation
        )
        preflight_events = _events(checked.outcome.notices)
        if not checked.proceed:
            return Transition(checked.outcome.status, world.ledger, events=preflight_events)
        status = checked.outcome.status
    directives = attempt_directives(
        world.spec,
        generation=1,
        attempt=0,
        resume_step=None,
        lr_scale=1.0,
        rewarmup_steps=0,
        skip=world.skip_ranges,
    )
    nodes = world.spec.workers.nodes
    running = status.model_copy(
        update={"phase": Phase.RUNNING, "attempt": 0, "directives_generation": 1, "lr_scale": 1.0}
    )
    running = clear_ready(
        running, world, reason=Reason.CREATED, message=f"created {nodes} worker pod(s) of attempt 0"
    )
    running = set_healthy(running, world, message=NO_SIGNAL_YET)
    message = f"attempt 0: {nodes} pod(s), rendezvous id {naming.rendezvous_id(world.job, 0)}"
    return Transition(
        running,
        world.ledger,
        launch=Launch(directives, (None,) * nodes, placement=_placement(world)),
        events=(*preflight_events, Event("Normal", Reason.CREATED, message)),
    )


# --- Running and Confirming -----------------------------------------------------------------


def _current(status: StableTrainingJobStatus, world: World) -> list[PodFacts]:
    return [p for p in world.pods if p.attempt == status.attempt]


def _fresh(status: StableTrainingJobStatus, world: World) -> list[AgentStatus]:
    return [
        r.status
        for r in world.scrapes
        if r.status is not None and r.status.attempt == status.attempt
    ]


def _with_numbers(status: StableTrainingJobStatus, world: World) -> StableTrainingJobStatus:
    """Live numbers from this tick's scrapes: rank 0's view (all ranks agree on them)."""
    fresh = sorted(_fresh(status, world), key=lambda s: s.node_rank)
    if not fresh:
        return status
    lead = fresh[0]
    steps = [s.step for s in fresh if s.step is not None]
    tokens = finite_or(lead.tokens_per_second, None)
    return status.model_copy(
        update={
            "step": max(steps) if steps else status.step,
            "loss": rounded_loss(lead.loss),
            "loss_baseline": finite_or(lead.loss_baseline, None),
            "grad_norm": finite_or(lead.grad_norm, None),
            "tokens_per_second": tokens if tokens is None or tokens >= 0 else None,
            "checkpoints": merged_inventory(status.checkpoints, fresh),
        }
    )


def _running(status: StableTrainingJobStatus, world: World) -> Transition:
    current = _current(status, world)
    status = _with_numbers(status, world)
    hold = _hold(world)
    if hold is not None:  # Running or Confirming: a rollback being confirmed is given up
        return _suspend(status, world, hold)
    if status.save_request is not None:  # suspend was withdrawn while the pods saved
        status = status.model_copy(update={"save_request": None})
    nodes = world.spec.workers.nodes
    if sum(p.state is PodState.SUCCEEDED for p in current) >= nodes:
        return _succeeded(status, world)
    unrestorable = _restore_failures(status, current)
    if unrestorable:
        return _replan(status, world, unrestorable)
    observations, trips, incident = gather_observations(
        status,
        world.spec,
        current=current,
        fresh=_fresh(status, world),
        progress=world.progress,
        now=world.now,
    )
    evaluation = evaluate(
        world.spec.recovery, observations, world.ledger, now=world.now, lr_scale=status.lr_scale
    )
    decision = evaluation.decision
    if decision is not None:
        transition = _act(
            status, world, _crash_looped(status, world, decision, incident), trips, incident
        )
        if _only_alerts(decision):
            transition = _further_alerts(
                transition, world, observations, decision, trips=trips, incident=incident
            )
    else:
        transition = _keep_running(status, world, current)
        if transition.status.phase is Phase.CONFIRMING:
            transition = _confirm(transition, world)
        transition = _unschedulable(transition, world, current)
    return dataclasses.replace(transition, deferred=evaluation.deferred)


def _unschedulable(transition: Transition, world: World, current: Sequence[PodFacts]) -> Transition:
    """Pods of the attempt the scheduler could not place for longer than the bound: said in
    the Unschedulable condition and an Event; with whenUnschedulable Release every pod of the
    attempt stops, and the attempt is tried again after the bound (phase Suspended)."""
    status = transition.status
    scheduling = world.spec.scheduling
    stuck = stuck_pods(current, status.attempt, world.now, scheduling)
    status, notes = said(status, world, stuck)
    events = (*transition.events, *(Event(*note) for note in notes))
    if stuck is None or scheduling.when_unschedulable is not UnschedulableAction.RELEASE:
        return dataclasses.replace(transition, status=status, events=events)
    message = (
        f"{stuck.message}; stopping every pod of the attempt so the placed ones free their "
        f"nodes, then trying again in {scheduling.unschedulable_seconds} s"
    )[:1024]
    stopping = status.model_copy(update={"phase": Phase.STOPPING, "plan": None})
    stopping = set_suspended(stopping, world, reason=Reason.UNSCHEDULABLE, message=message)
    if status.phase is Phase.CONFIRMING:  # the retry resumes from the newest checkpoint
        stopping = clear_recovering(
            stopping,
            world,
            reason=Reason.UNSCHEDULABLE,
            message=f"attempt {status.attempt}'s pods were unschedulable before it was confirmed",
        )
    return Transition(
        stopping,
        transition.ledger,
        delete_pods=tuple(sorted(p.name for p in world.pods)),
        events=(*events, Event("Warning", Reason.UNSCHEDULABLE, message)),
    )


def _crash_looped(
    status: StableTrainingJobStatus, world: World, decision: Decision, incident: Incident
) -> Decision:
    """A restart after a worker failure becomes the crash-loop action when the failure
    completes a crash loop (policy/crashloop.py)."""
    restarts = kind_of(decision.action).counter is StatusCounter.RESTARTS
    if not restarts or incident.failure is None:
        return decision
    loop = crash_loop(
        world.spec.recovery.crash_loop,
        incident.failure,
        status.last_failure,
        every_rank_failed=incident.every_rank_failed,
    )
    if loop is None:
        return decision
    avoid, _ = avoided_nodes(status.suspect_nodes, world.spec.recovery.placement)
    culprits = {s.node for s in incident.suspects if s.avoid and s.node}
    if repeat_leaves_the_node(culprits, status.rollback_history, status.suspect_nodes, avoid):
        return decision
    if loop.action is CrashLoopAction.FAIL:
        return dataclasses.replace(
            decision, action=Action.FAIL, reason=Reason.CRASH_LOOP, message=loop.message[:1024]
        )
    return dataclasses.replace(
        decision,
        reason=Reason.CRASH_LOOP,
        message=loop.message[:1024],
        backoff_seconds=loop.backoff_seconds,
    )


def _restore_failures(status: StableTrainingJobStatus, current: Sequence[PodFacts]) -> list[str]:
    """Messages of this attempt's pods that could not restore the planned step."""
    plan = status.plan
    if plan is None or plan.target_step is None or plan.next_attempt != status.attempt:
        return []
    return [
        f"pod {p.name}: {p.message}"
        for p in current
        if p.restore_failure == (plan.target_step, status.attempt)
    ]


def _replan(status: StableTrainingJobStatus, world: World, evidence: Sequence[str]) -> Transition:
    """The relaunch could not restore its target: plan the same action again without it.

    Same rule, bound, onset, LR and skip list, no budget counted: the decision stands, only
    the checkpoint was wrong. A rollback's bound still holds, so the next choice is an
    older checkpoint inside it (or the rule's no-checkpoint decision), never a newer one.
    """
    plan = status.plan
    assert plan is not None
    assert plan.target_step is not None
    excluded = (*plan.excluded_steps, plan.target_step)
    message = (
        f"attempt {status.attempt} could not restore step {plan.target_step}; planning the "
        f"same {plan.action} again without it ({'; '.join(evidence)})"
    )[:1024]
    if len(excluded) > EXCLUDED_MAX:
        return _failed(status, world, Reason.NO_CHECKPOINT, message)
    again = plan.model_copy(
        update={
            "started_at": world.now,
            "from_attempt": status.attempt,
            "next_attempt": status.attempt + 1,
            "target_step": None,
            "checkpoint_choice": "",
            "directives_generation": None,
            "excluded_steps": excluded,
            # A fresh stop: which pods it keeps is decided anew (a rank the last relaunch
            # replaced has a new pod, which may well run the next attempt).
            "in_place": False,
            "replaced_ranks": (),
        }
    )
    stopping = status.model_copy(update={"phase": Phase.STOPPING, "plan": again})
    stopping, stop = _first_stop(stopping, world)
    stopping = clear_ready(
        stopping,
        world,
        reason=Reason.RESTORE_FAILED,
        message=f"{_stopping_message(stopping, world)}: restore failed",
    )
    return dataclasses.replace(
        stop,
        status=stopping,
        events=(Event("Warning", Reason.RESTORE_FAILED, message), *stop.events),
    )


def _keep_running(
    status: StableTrainingJobStatus, world: World, current: Sequence[PodFacts]
) -> Transition:
    """No decision: conditions from what runs, and live directives to pods that lag."""
    fresh = _fresh(status, world)
    if not status.attempt_progressed and any(
        s.heartbeat is not None and s.heartbeat.steps_completed > 0 for s in fresh
    ):
        status = status.model_copy(update={"attempt_progressed": True})
    nodes = world.spec.workers.nodes
    running = sum(p.state is PodState.RUNNING for p in current)
    if running >= nodes and len(fresh) >= nodes:
        status = set_ready(
            status, world, message=f"{running} pod(s) of attempt {status.attempt} run and report"
        )
    elif running < nodes:
        status = clear_ready(
            status,
            world,
            reason=Reason.PODS_NOT_READY,
            message=f"{running} of {nodes} pod(s) of attempt {status.attempt} run",
        )
    if fresh:
        firing = sorted({f.signal for s in fresh for f in s.firing})
        healthy = condition(status.conditions, ConditionType.HEALTHY)
        alerted = healthy is not None and healthy.reason in LIVE_ACTION_REASONS
        if not firing:
            status = set_healthy(status, world, message=NO_SIGNAL_FIRES)
        elif not alerted:
            status = clear_healthy(
                status, world, reason=Reason.SIGNAL_FIRING, message=f"firing: {', '.join(firing)}"
            )
    lagging = tuple(
        sorted(
            r.pod
            for r in world.scrapes
            if r.status is not None
            and r.status.attempt == status.attempt
            and r.status.applied_generation < status.directives_generation
        )
    )
    live = None
    # Confirming too: a ReduceLR decided while a rollback is confirmed is retried like any
    # other (its confirmation needs the new generation applied on every pod).
    if lagging and world.attempt_directives is not None:
        live = live_directives(
            world.attempt_directives,
            generation=status.directives_generation,
            lr_scale=status.lr_scale,
        )
    return Transition(
        status,
        world.ledger,
        live=live,
        live_pods=lagging if live else (),
        start_pods=lagging_starts(current, world.supervisors, status.attempt),
    )


def _confirm(transition: Transition, world: World) -> Transition:
    """Confirming -> Running once the run is past the old onset with the signal quiet (see
    plan/confirm.py), or unconfirmed once recovery.confirmTimeoutSeconds ran out."""
    status = transition.status
    plan = status.plan
    if plan is None:
        return Transition(status.model_copy(update={"phase": Phase.RUNNING}), transition.ledger)
    verdict = confirmation(
        plan,
        _fresh(status, world),
        nodes=world.spec.workers.nodes,
        attempt=status.attempt,
        directives_generation=status.directives_generation,
        lr_scale=status.lr_scale,
        now=world.now,
        timeout=timedelta(seconds=world.spec.recovery.confirm_timeout_seconds),
    )
    if verdict.outcome is Outcome.WAITING:
        return transition
    confirmed = verdict.outcome is Outcome.CONFIRMED
    reason = Reason.ROLLBACK_CONFIRMED if confirmed else Reason.CONFIRMATION_TIMED_OUT
    done = status.model_copy(update={"phase": Phase.RUNNING, "plan": None})
    done = clear_recovering(done, world, reason=reason, message=verdict.message)
    event = Event("Normal" if confirmed else "Warning", reason, verdict.message[:1024])
    return Transition(done, transition.ledger, events=(*transition.events, event))


def _suspend(status: StableTrainingJobStatus, world: World, hold: _Hold) -> Transition:
    """spec.suspend, or Kueue's eviction: ask every pod for a final checkpoint (a live
    directive), wait for each to report it saved and flushed to the PFS, at most
    SUSPEND_SAVE_SECONDS, then stop."""
    reachable = tuple(
        sorted(p.name for p in _current(status, world) if p.state is PodState.RUNNING and p.ip)
    )
    request = status.save_request
    if request is None:
        if not reachable or world.attempt_directives is None:
            return _stop_suspended(status, world, "no pod runs to save a final checkpoint", hold)
        request = status.directives_generation + 1
        saving = status.model_copy(
            update={"save_request": request, "directives_generation": request}
        )
        message = (
            f"{hold.cause}: every pod saves a final checkpoint (at most "
            f"{SUSPEND_SAVE.total_seconds():.0f} s), then every pod stops"
        )
        saving = set_suspended(saving, world, reason=hold.saving, message=message)
        live = live_directives(
            world.attempt_directives,
            generation=request,
            lr_scale=status.lr_scale,
            save_request=request,
        )
        event = Event("Normal", hold.saving, message)
        return Transition(saving, world.ledger, live=live, live_pods=reachable, events=(event,))
    fresh = _fresh(status, world)
    answered = {s.node_rank: s.saved_step for s in fresh if s.saved_request >= request}
    waited = world.now - _suspended_since(status, world)
    if len(answered) < world.spec.workers.nodes and reachable and waited < SUSPEND_SAVE:
        lagging = tuple(
            sorted(
                r.pod for r in world.scrapes if r.status and r.status.applied_generation < request
            )
        )
        resend: Directives | None = None
        if lagging and world.attempt_directives is not None:
            resend = live_directives(
                world.attempt_directives,
                generation=request,
                lr_scale=status.lr_scale,
                save_request=request,
            )
        return Transition(status, world.ledger, live=resend, live_pods=lagging if resend else ())
    saved = {step for step in answered.values()}
    if len(answered) >= world.spec.workers.nodes and len(saved) == 1 and None not in saved:
        why = f"every pod saved the final checkpoint of step {saved.pop()} to both tiers"
    else:
        why = (
            f"{len(answered)} of {world.spec.workers.nodes} pod(s) saved a final checkpoint "
            f"within {waited.total_seconds():.0f} s (steps {sorted(s for s in saved if s)}); "
            "resuming continues from the newest checkpoint"
        )
    return _stop_suspended(status, world, why, hold)


def _stop_suspended(
    status: StableTrainingJobStatus, world: World, why: str, hold: _Hold
) -> Transition:
    stopping = status.model_copy(
        update={"phase": Phase.STOPPING, "plan": None, "save_request": None}
    )
    message = f"{hold.cause}: {why}; stopping every pod"[:1024]
    stopping = set_suspended(stopping, world, reason=hold.stopped, message=message)
    if status.phase is Phase.CONFIRMING:
        stopping = clear_recovering(
            stopping,
            world,
            reason=Reason.SUSPENDED,
            message=f"suspended before attempt {status.attempt}'s relaunch was confirmed",
        )
    return Transition(
        stopping,
        world.ledger,
        delete_pods=tuple(p.name for p in world.pods),
        events=(Event("Normal", hold.stopped, message),),
    )


def _succeeded(status: StableTrainingJobStatus, world: World) -> Transition:
    """Training complete. A relaunch still Confirming is confirmed by it: every pod trained
    to the end, past the old onset, and none tripped (a scrape may not have seen it pass)."""
    events: tuple[Event, ...] = ()
    plan = status.plan
    if status.phase is Phase.CONFIRMING and plan is not None:
        bar = plan.confirm_step if plan.confirm_step is not None else plan.target_step
        confirmed = (
            f"attempt {status.attempt} trained to the end past step {bar or 0} without a trip"
        )
        status = clear_recovering(
            status, world, reason=Reason.ROLLBACK_CONFIRMED, message=confirmed
        )
        events = (Event("Normal", Reason.ROLLBACK_CONFIRMED, confirmed),)
    final = with_final_numbers(status, _current(status, world))
    done = final.model_copy(update={"phase": Phase.SUCCEEDED, "plan": None})
    message = f"every worker of attempt {status.attempt} succeeded"
    done = set_complete(done, world, message=message)
    done = clear_ready(done, world, reason=Reason.TRAINING_COMPLETE, message=message)
    complete = Event("Normal", Reason.TRAINING_COMPLETE, message)
    return Transition(done, world.ledger, events=(*events, complete))


def _act(
    status: StableTrainingJobStatus,
    world: World,
    decision: Decision,
    trips: Sequence[TripReport],
    incident: Incident,
) -> Transition:
    """Carry a decision into status: a plan for stopping actions, a change for live ones."""
    ledger = record(world.ledger, decision, now=world.now)
    kind = kind_of(decision.action)
    event = Event(kind.event_type, decision.reason, f"{decision.action}: {decision.told}"[:1024])
    if kind.stops_the_run:
        return _stop_for(
            status, world, decision, trips=trips, ledger=ledger, event=event, incident=incident
        )
    counted = status.model_copy(update={"counters": _counted(status.counters, kind)})
    if decision.lr_scale is not None:
        changed = counted.model_copy(
            update={
                "lr_scale": decision.lr_scale,
                "directives_generation": status.directives_generation + 1,
            }
        )
        changed = clear_healthy(changed, world, reason=decision.reason, message=decision.message)
        changed = _recorded(changed, _live_record(changed, world, decision))
        live = None
        if world.attempt_directives is not None:
            live = live_directives(
                world.attempt_directives,
                generation=changed.directives_generation,
                lr_scale=decision.lr_scale,
            )
        pods = tuple(sorted(p.name for p in _current(status, world) if p.ip))
        return Transition(
            changed,
            ledger,
            live=live,
            live_pods=pods if live else (),
            events=(event,),
            decision=decision,
        )
    alerted = clear_healthy(
        counted, world, reason=kind.reason, message=f"{decision.signal}: {decision.message}"
    )
    alerted = _recorded(alerted, _live_record(alerted, world, decision))
    return Transition(alerted, ledger, events=(event,), decision=decision)


def _only_alerts(decision: Decision) -> bool:
    """A decision that changes nothing but status and Events (an Alert)."""
    return not kind_of(decision.action).stops_the_run and decision.lr_scale is None


def _further_alerts(
    transition: Transition,
    world: World,
    observations: Sequence[Observation],
    first: Decision,
    *,
    trips: Sequence[TripReport],
    incident: Incident,
) -> Transition:
    """The other signals' Alerts of the same scrape, taken now too. Two report-only signals
    firing together (a loss spike and its grad-norm spike) are seen together; deferred to
    the next tick, the second one's episode may be over by its scrape and its Alert lost.
    Only Alerts join: anything that acts on the run waits for its own tick, as before."""
    taken = {first.signal}
    while True:
        rest = [o for o in observations if o.signal not in taken]
        later = dataclasses.replace(world, ledger=transition.ledger)
        evaluation = evaluate(
            world.spec.recovery, rest, later.ledger, now=world.now,
            lr_scale=transition.status.lr_scale,
        )  # fmt: skip
        decision = evaluation.decision
        if decision is None or not _only_alerts(decision):
            return transition
        taken.add(decision.signal)
        more = _act(transition.status, later, decision, trips, incident)
        transition = dataclasses.replace(more, events=(*transition.events, *more.events))


def _counted(counters: Counters, kind: ActionKind) -> Counters:
    """The counters with the action's own one added (a Fail has none)."""
    if kind.counter is None:
        return counters
    name = kind.counter.value
    return counters.model_copy(update={name: getattr(counters, name) + 1})


def _stop_for(
    status: StableTrainingJobStatus,
    world: World,
    decision: Decision,
    *,
    trips: Sequence[TripReport],
    ledger: PolicyLedger,
    event: Event,
    incident: Incident,
) -> Transition:
    kind = kind_of(decision.action)
    counters = _counted(status.counters, kind)
    counters = counters.model_copy(update={"trips": counters.trips + bool(trips)})
    plan = stopping_plan(
        decision,
        started_at=world.now,
        reached_step=status.step,
        from_attempt=status.attempt,
        added_skip=skipping_repeat_suspects(decision.skip, world.skip_ranges)[:SKIPS_PER_ACTION],
        suspects=incident.suspects[:8],
        confirm_step=confirm_step(
            decision.action, decision.signal, decision.onset_step, world.spec.detection
        ),
        loss_baseline=_pre_spike_baseline(status),
    )
    suspect_nodes, suspect_events = remember_suspects(
        status.suspect_nodes, incident.suspects, world.spec.recovery.placement, now=world.now
    )
    stopping = status.model_copy(
        update={
            "phase": Phase.STOPPING,
            "plan": plan,
            "suspect_nodes": suspect_nodes,
            "last_failure": incident.failure or status.last_failure,
            "counters": counters,
            "last_trip": trips[0] if trips else status.last_trip,
            "checkpoints": merged_inventory(status.checkpoints, trips=trips),
            "last_manual_request_id": decision.request_id or status.last_manual_request_id,
        }
    )
    stopping, stop = _first_stop(stopping, world)
    # A Fail's Recovering message becomes the Failed condition's: it names the evidence too.
    message = decision.told if kind.ends_the_job else decision.message
    stopping = set_recovering(stopping, world, reason=decision.reason, message=message[:1024])
    stopping = clear_ready(
        stopping, world, reason=decision.reason, message=_stopping_message(stopping, world)
    )
    # A restart answers a fault outside the model: the training itself stays Healthy.
    if kind.counter is not StatusCounter.RESTARTS:
        stopping = clear_healthy(
            stopping, world, reason=decision.reason, message=decision.evidence or decision.message
        )
    return dataclasses.replace(
        stop,
        status=stopping,
        ledger=ledger,
        events=(
            event,
            *(Event("Warning", Reason.SUSPECT_NODE, m) for m in suspect_events),
            *stop.events,
        ),
        decision=decision,
    )


def _pre_spike_baseline(status: StableTrainingJobStatus) -> float | None:
    """The baseline to compare the confirmed run with: the one a plan being replaced by a
    recurrence carried (the level before the first spike), else the newest scraped one."""
    if status.plan is not None and status.plan.loss_baseline is not None:
        return status.plan.loss_baseline
    return status.loss_baseline


def _first_stop(
    status: StableTrainingJobStatus, world: World
) -> tuple[StableTrainingJobStatus, Transition]:
    """The plan's stop begins: every pod deleted, or, for a relaunch in place, the pods that
    can run the next attempt told to stop their processes and only the others deleted."""
    plan = status.plan
    assert plan is not None
    everything = tuple(sorted(p.name for p in world.pods))
    if kind_of(plan.action).ends_the_job or not supervised(world.spec):
        return status, Transition(status, world.ledger, delete_pods=everything)
    parts = _split(status, world, plan)
    kept_ranks = {p.rank for p in parts.kept}
    plan = plan.model_copy(
        update={
            "in_place": True,
            "replaced_ranks": tuple(
                r for r in range(world.spec.workers.nodes) if r not in kept_ranks
            ),
        }
    )
    status = status.model_copy(update={"plan": plan})
    left = _left_nodes(status, world)
    shape = pod_shape(world.spec)
    replaced = [
        f"pod {p.name} (rank {p.rank}) is replaced: {why}"
        for p in parts.replaced
        if p.attempt == plan.from_attempt
        and (why := keepable(p, (plan.from_attempt,), shape=shape, avoided=left))
    ]
    return status, Transition(
        status,
        world.ledger,
        delete_pods=tuple(sorted(p.name for p in parts.replaced)),
        stop_pods=tuple(p.name for p in parts.kept),
        stop_attempt=plan.from_attempt,
        events=tuple(Event("Normal", Reason.POD_REPLACED, m[:1024]) for m in replaced[:16]),
    )


def _left_nodes(status: StableTrainingJobStatus, world: World) -> set[str]:
    avoid, _ = avoided_nodes(status.suspect_nodes, world.spec.recovery.placement)
    return nodes_to_leave(status.suspect_nodes, avoid)


def _split(status: StableTrainingJobStatus, world: World, plan: Plan) -> Split:
    attempts = (plan.from_attempt, plan.next_attempt)
    return split(
        world.pods,
        attempts if status.phase is Phase.RELAUNCHING else attempts[:1],
        shape=pod_shape(world.spec),
        avoided=_left_nodes(status, world),
        replaced_ranks=plan.replaced_ranks if plan.in_place else (),
    )


def _stopping_message(status: StableTrainingJobStatus, world: World) -> str:
    plan = status.plan
    assert plan is not None
    if not plan.in_place:
        return f"stopping every pod of attempt {plan.from_attempt} for {plan.action}"
    nodes = world.spec.workers.nodes
    kept = nodes - len(plan.replaced_ranks)
    return (
        f"stopping the training processes of attempt {plan.from_attempt} for {plan.action}: "
        f"{kept} of {nodes} pod(s) restart in place, {len(plan.replaced_ranks)} replaced"
    )


# --- Stopping -------------------------------------------------------------------------------


def _stopping(status: StableTrainingJobStatus, world: World) -> Transition:
    plan = status.plan
    if plan is not None:
        status = _late_trips(status, world, plan.from_attempt)
        if plan.in_place:
            return _stopping_in_place(status, world, plan)
    if world.pods:
        since = plan.started_at if plan is not None else _suspended_since(status, world)
        # Pods left only on nodes that stopped reporting are forced at once: no kubelet
        # will ever confirm their graceful deletion.
        force = world.now - since >= stop_force_after(world.spec) or all(
            p.node_silent for p in world.pods
        )
        # A pod already being deleted is not asked again (a 256-pod job's every tick
        # would be 256 requests) until the grace is over and it is forced.
        asked = [p for p in world.pods if force or not p.deleting]
        return Transition(
            status,
            world.ledger,
            delete_pods=tuple(sorted(p.name for p in asked)),
            force_delete=force,
        )
    if plan is None:
        suspended = status.model_copy(update={"phase": Phase.SUSPENDED})
        suspended = clear_ready(
            suspended, world, reason=Reason.SUSPENDED, message=SUSPENDED_NO_PODS
        )
        return Transition(suspended, world.ledger)
    if kind_of(plan.action).ends_the_job:
        return _failed(status, world, *_recovering_reason(status))
    planning = status.model_copy(update={"phase": Phase.PLANNING})
    return Transition(planning, world.ledger)


def _stopping_in_place(status: StableTrainingJobStatus, world: World, plan: Plan) -> Transition:
    """The kept pods' processes stop (their supervisors report each attempt ended); a kept
    pod whose container ended, whose processes survive KILL or are not gone after the grace
    period plus STOP_FORCE_MARGIN is replaced after all; every other pod goes as in a full
    stop. What the supervisors scanned on their tiers meanwhile joins the inventory."""
    status = status.model_copy(
        update={"checkpoints": merged_inventory(status.checkpoints, _handed_over(status, world))}
    )
    overdue = world.now - plan.started_at >= stop_force_after(world.spec)
    parts = _split(status, world, plan)
    kept: list[PodFacts] = []
    late: list[tuple[PodFacts, str]] = []
    for pod in parts.kept:
        report = world.supervisors.get(pod.name)
        why = must_replace(pod, report, plan.from_attempt, overdue=overdue)
        if why is None:
            kept.append(pod)
        else:
            late.append((pod, why))
    events: tuple[Event, ...] = ()
    if late:
        ranks = sorted({*plan.replaced_ranks, *(pod.rank for pod, _ in late)})
        plan = plan.model_copy(update={"replaced_ranks": tuple(ranks)})
        status = status.model_copy(update={"plan": plan})
        events = tuple(
            Event("Warning", Reason.POD_REPLACED, f"{why}: replacing it") for _, why in late
        )
    going = [*parts.replaced, *(pod for pod, _ in late)]
    waiting = [p for p in kept if not stopped(world.supervisors.get(p.name), plan.from_attempt)]
    if going or waiting:
        force = overdue or (bool(going) and all(p.node_silent for p in going))
        asked = [p for p in going if force or not p.deleting]
        return Transition(
            status,
            world.ledger,
            delete_pods=tuple(sorted(p.name for p in asked)),
            force_delete=force,
            stop_pods=tuple(p.name for p in waiting),
            stop_attempt=plan.from_attempt,
            events=events,
        )
    planning = status.model_copy(update={"phase": Phase.PLANNING})
    return Transition(planning, world.ledger, events=events)


def _handed_over(status: StableTrainingJobStatus, world: World) -> list[AgentStatus]:
    """Statuses of the stopping attempt's pods this tick: the agents' own while they still
    answer, else their supervisors' scans of the tiers."""
    return [*_fresh(status, world), *world.handed_over]


def _late_trips(
    status: StableTrainingJobStatus, world: World, attempt: int
) -> StableTrainingJobStatus:
    """Trip reports that arrived after the decision (a scrape saw the signal first, or the
    other pods' reports came later): their inventory joins the choice, and the attempt's
    trip is counted once (status.lastTrip records which attempt it belongs to)."""
    trips = pod_trips(world.pods, attempt)
    if not trips:
        return status
    updates: dict[str, object] = {"checkpoints": merged_inventory(status.checkpoints, trips=trips)}
    if status.last_trip is None or status.last_trip.attempt != attempt:
        counters = status.counters
        updates["last_trip"] = trips[0]
        updates["counters"] = counters.model_copy(update={"trips": counters.trips + 1})
    return status.model_copy(update=updates)


def _suspended_since(status: StableTrainingJobStatus, world: World) -> datetime:
    suspended = condition(status.conditions, ConditionType.SUSPENDED)
    return suspended.last_transition_time if suspended is not None else world.now


def _recovering_reason(status: StableTrainingJobStatus) -> tuple[str, str]:
    recovering = condition(status.conditions, ConditionType.RECOVERING)
    if recovering is None:
        return Reason.FAILED_BY_POLICY.value, FAILED_BY_POLICY
    return recovering.reason, recovering.message


def _failed(status: StableTrainingJobStatus, world: World, reason: str, message: str) -> Transition:
    """The job ends Failed; the history records the Fail with what it answered."""
    plan = status.plan
    if plan is not None:
        failing = RollbackRecord.failing(
            plan, time=world.now, reason=reason, lr_scale=status.lr_scale, attempt=status.attempt
        )
        status = _recorded(status, failing)
    failed = status.model_copy(update={"phase": Phase.FAILED, "plan": None})
    failed = set_failed(failed, world, reason=reason, message=message)
    failed = clear_recovering(failed, world, reason=reason, message=message)
    failed = clear_ready(failed, world, reason=reason, message=FAILED_NO_PODS)
    if reason in (Reason.ROLLBACK_BUDGET_EXHAUSTED, Reason.RESTART_BUDGET_EXHAUSTED):
        failed = set_budget_exhausted(failed, world, reason=reason, message=message)
    return Transition(
        failed,
        world.ledger,
        events=(Event("Warning", reason, f"failed: {message}"),),
        delete_pods=_still_running(world),
    )


def _still_running(world: World) -> tuple[str, ...]:
    """Pods of a job that ended Failed whose container still runs or waits to start: the
    pods a stop kept in place (their supervisors wait for the next attempt's order), or the
    next attempt's when a restore failed everywhere. They hold their nodes, and under Kueue
    the quota the job gave back, until deleted. Pods that ended stay for their logs; a pod
    already being deleted is not asked again."""
    return tuple(
        sorted(
            p.name for p in world.pods if not p.deleting and (p.container_running or not p.finished)
        )
    )


# --- Planning -------------------------------------------------------------------------------


def _planning(status: StableTrainingJobStatus, world: World) -> Transition:
    plan = status.plan
    if plan is None:
        return Transition(status.model_copy(update={"phase": Phase.RUNNING}), world.ledger)
    kind = kind_of(plan.action)
    restarting = kind.counter is StatusCounter.RESTARTS and plan.rule != RESUME_RULE
    backoff = restart_backoff(recoveries_in_a_row(status.rollback_history, plan.started_at))
    if plan.backoff_seconds is not None:
        backoff = timedelta(seconds=plan.backoff_seconds)
    if restarting and world.now - plan.started_at < backoff:
        return Transition(status, world.ledger)
    # BothTiers asks for a local copy on every node the relaunch prefers; a rank whose
    # node is avoided lands on a node not known yet and re-seeds from the PFS.
    nodes = [n for n in _preferred_nodes(status, world)[0] if n] or sorted(
        {copy.node for record in status.checkpoints for copy in record.local}
    )
    choice = choose_checkpoint(
        status.checkpoints,
        step_bound(plan, world.spec),
        nodes,
        selection=world.spec.checkpoints.selection,
        onset=plan.onset_step if kind.goes_before_onset else None,
        when_none=no_checkpoint_decision(plan, world.spec),
        excluded=plan.excluded_steps,
        stable_only=kind.relaunch is not Relaunch.FROM_LATEST,
        memory_pods=_memory_pods(status, world, plan),
    )
    if not choice.usable:
        return _failed(status, world, Reason.NO_CHECKPOINT, choice.reason)
    planned = plan.model_copy(
        update={
            "target_step": choice.step,
            "checkpoint_choice": choice.reason[:CHOICE_MAX],
            "lr_scale": plan.lr_scale if plan.lr_scale is not None else status.lr_scale,
            "directives_generation": status.directives_generation + 1,
        }
    )
    skipped = "; ".join(describe_skip(r) for r in planned.added_skip) or "nothing"
    message = (
        f"attempt {planned.next_attempt} resumes from "
        f"{f'step {choice.step}' if choice.step else 'step 0 (nothing restored)'} "
        f"({choice.reason}); "
        f"LR scale {planned.lr_scale:g}, re-warm-up {planned.rewarmup_steps} steps, "
        f"skip {skipped}"
    )
    relaunching = status.model_copy(update={"phase": Phase.RELAUNCHING, "plan": planned})
    relaunching = set_recovering(
        relaunching, world, reason=_recovering_reason(status)[0], message=message
    )
    return Transition(relaunching, world.ledger, events=(Event("Normal", "Planned", message),))


def _memory_pods(
    status: StableTrainingJobStatus, world: World, plan: Plan
) -> tuple[str | None, ...]:
    """By rank, the pod kept in place whose memory tier the next attempt can restore from
    (None: a new pod); nothing unless this is an in-place RestartFromLatest."""
    if not plan.in_place:
        return ()
    kept = {p.rank: p.name for p in _split(status, world, plan).kept}
    return surviving_memory(plan, [kept.get(r) for r in range(world.spec.workers.nodes)])


# --- Relaunching ----------------------------------------------------------------------------


def _relaunching(status: StableTrainingJobStatus, world: World) -> Transition:
    if not _may_run(world):
        # Evicted during the recovery: the plan waits for readmission with no pod left, so
        # Kueue gets its quota back (it does not while a pod holds a node): the pods a
        # relaunch in place would keep (their processes stopped) go too, and the next
        # admission creates every pod anew.
        leaving = tuple(sorted(p.name for p in world.pods if not p.deleting))
        return Transition(status, world.ledger, delete_pods=leaving)
    plan = status.plan
    if plan is None or plan.directives_generation is None:
        return Transition(status.model_copy(update={"phase": Phase.PLANNING}), world.ledger)
    skip = merge_skip_ranges(world.skip_ranges, plan.added_skip)
    lr_scale = plan.lr_scale if plan.lr_scale is not None else status.lr_scale
    directives = attempt_directives(
        world.spec,
        generation=plan.directives_generation,
        attempt=plan.next_attempt,
        resume_step=plan.target_step,
        lr_scale=lr_scale,
        rewarmup_steps=plan.rewarmup_steps,
        skip=skip,
    )
    spill = skip if len(skip) > SKIP_RANGES_INLINE_MAX else None
    kept = _split(status, world, plan).kept if plan.in_place else ()
    kept_ranks = {p.rank for p in kept}
    nodes = world.spec.workers.nodes
    replaced = [rank for rank in range(nodes) if rank not in kept_ranks]
    entry = RollbackRecord.from_plan(
        plan, reason=_recovering_reason(status)[0], lr_scale=lr_scale
    ).model_copy(
        update={
            "restarted_in_place": len(kept),
            "replaced_pods": len(replaced),
            "replaced_ranks": tuple(replaced[:REPLACED_LISTED_MAX]) if plan.in_place else (),
        }
    )
    history = status.rollback_history
    if plan.rule == RESUME_RULE:
        pass
    elif plan.excluded_steps and history:
        # A re-plan after RestoreFailed: the same action, whose first relaunch restored
        # nothing; its entry now names the step this attempt restores.
        history = (*history[:-1], entry.model_copy(update={"time": history[-1].time}))
    else:
        history = (*history, entry)[-HISTORY_MAX:]
    relaunched = status.model_copy(
        update={
            "phase": Phase.CONFIRMING,
            "attempt": plan.next_attempt,
            "directives_generation": plan.directives_generation,
            "lr_scale": lr_scale,
            "active_skip_ranges": skip[-SKIP_RANGES_INLINE_MAX:],
            "skip_ranges_total": len(skip),
            "skip_ranges_config_map": (
                naming.skip_ranges_config_map(world.job) if spill else status.skip_ranges_config_map
            ),
            "rollback_history": history,
            "step": plan.target_step,
            "attempt_progressed": False,
            "checkpoints": without_abandoned(
                status.checkpoints, plan.target_step or 0, plan.next_attempt
            ),
        }
    )
    message = (
        f"relaunched attempt {plan.next_attempt} ({nodes} pod(s)) with "
        f"directives generation {plan.directives_generation}"
    )
    if plan.in_place:
        message += (
            f": {len(kept)} restarted in place"
            f"{' (' + ', '.join(p.name for p in kept[:16]) + ')' if kept else ''}, "
            f"{len(replaced)} replaced"
        )
    elif world.spec.recovery.restart is RestartMode.IN_PLACE and not supervised(world.spec):
        message += ": every pod replaced (the training container has no command to wrap)"
    relaunched = clear_ready(relaunched, world, reason=Reason.CREATED, message=message)
    preferred, avoid, required = _preferred_nodes(status, world)
    if avoid:
        message += f"; avoiding suspect node(s) {', '.join(avoid)}"
    return Transition(
        relaunched,
        world.ledger,
        launch=Launch(
            directives,
            preferred,
            spill,
            avoid,
            required,
            placement=_placement(world),
            in_place=tuple((p.rank, p.name) for p in kept),
        ),
        events=(Event("Normal", "Relaunched", message),),
        recovered_after=world.now - plan.started_at,
    )


def _preferred_nodes(
    status: StableTrainingJobStatus, world: World
) -> tuple[tuple[str | None, ...], tuple[str, ...], bool]:
    """Per rank, the node the relaunch prefers (None: any but the avoided ones), the
    avoided nodes, and whether avoiding them is required."""
    avoid, required = avoided_nodes(status.suspect_nodes, world.spec.recovery.placement)
    previous = [n if n not in avoid else None for n in world.previous_nodes]
    preferred = tuple(previous[: world.spec.workers.nodes]) + (None,) * max(
        world.spec.workers.nodes - len(previous), 0
    )
    return preferred, avoid, required


# --- Suspended and terminal phases ----------------------------------------------------------


def _suspended(status: StableTrainingJobStatus, world: World) -> Transition:
    if world.spec.suspend or not _may_run(world) or _retry_later(status, world):
        return Transition(status, world.ledger)
    plan = Plan(
        action=Action.RESTART_FROM_LATEST,
        rule=RESUME_RULE,
        signal=Signal.MANUAL.value,
        from_step=status.step or 0,
        started_at=world.now,
        from_attempt=status.attempt,
        next_attempt=status.attempt + 1,
    )
    planning = status.model_copy(update={"phase": Phase.PLANNING, "plan": plan})
    planning = clear_suspended(planning, world, message=_resuming(status))
    planning = set_recovering(
        planning, world, reason=Reason.RESUMED, message=RELAUNCHING_AFTER_SUSPEND
    )
    return Transition(planning, world.ledger, events=(Event("Normal", Reason.RESUMED, "resuming"),))


def _retry_later(status: StableTrainingJobStatus, world: World) -> bool:
    """Released for unschedulable pods (whenUnschedulable Release) less than the bound ago."""
    suspended = condition(status.conditions, ConditionType.SUSPENDED)
    if suspended is None or suspended.reason != Reason.UNSCHEDULABLE:
        return False
    bound = timedelta(seconds=world.spec.scheduling.unschedulable_seconds)
    return world.now - suspended.last_transition_time < bound


def _resuming(status: StableTrainingJobStatus) -> str | None:
    """The Suspended condition's message when the job resumes for another reason than
    spec.suspend being cleared."""
    suspended = condition(status.conditions, ConditionType.SUSPENDED)
    reason = suspended.reason if suspended is not None else ""
    if reason == Reason.EVICTED:
        return "admitted again by Kueue: relaunching from the newest checkpoint"
    if reason == Reason.UNSCHEDULABLE:
        return "trying the attempt's pods again after they were unschedulable"
    return None


def _terminal(status: StableTrainingJobStatus, world: World) -> Transition:
    if status.phase is Phase.FAILED:  # a deletion that did not go through is asked again
        return Transition(status, world.ledger, delete_pods=_still_running(world))
    return Transition(status, world.ledger)


_HANDLERS = {
    Phase.PENDING: _pending,
    Phase.RUNNING: _running,
    Phase.CONFIRMING: _running,
    Phase.STOPPING: _stopping,
    Phase.PLANNING: _planning,
    Phase.RELAUNCHING: _relaunching,
    Phase.SUSPENDED: _suspended,
    Phase.SUCCEEDED: _terminal,
    Phase.FAILED: _terminal,
}
