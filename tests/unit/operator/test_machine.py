"""The state machine's transitions, called directly: a NaN trip through every phase to a
confirmed rollback, the checkpoint choice, budgets, alerts, restarts, suspend."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest
from operator_builders import NODES, T0, agent, pod, record, spec, trip

from stabletrain_contract.channel import FindingReport
from stabletrain_contract.directives import RUN_END, SkipRange, SkipUnit
from stabletrain_contract.names import Action, AnomalyClass
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import EscalationSpec
from stabletrain_operator.api.status import Counters, RollbackRecord, StableTrainingJobStatus
from stabletrain_operator.machine import Transition, World, advance
from stabletrain_operator.observe.pod_facts import PodState
from stabletrain_operator.plan.sent_directives import attempt_directives
from stabletrain_operator.policy import PolicyLedger
from stabletrain_operator.reconcile import status_json

CHECKPOINTS = tuple(record(step) for step in (10, 20, 30, 40, 50))


def world(status: StableTrainingJobStatus, **changes: object) -> World:
    base: dict[str, object] = {
        "now": T0,
        "job": "job",
        "spec": spec(),
        "generation": 1,
        "pods": (),
        "ledger": PolicyLedger.from_job_status(status),
        "previous_nodes": ("node-a", "node-b"),
    }
    base.update(changes)
    return World(**base)  # type: ignore[arg-type]


def running(**changes: object) -> StableTrainingJobStatus:
    data: dict[str, object] = {
        "phase": Phase.RUNNING,
        "attempt": 0,
        "directives_generation": 1,
        "step": 57,
        "checkpoints": CHECKPOINTS,
    }
    data.update(changes)
    return StableTrainingJobStatus(**data)  # type: ignore[arg-type]


def tripped_pods(onset: int = 55) -> tuple[object, ...]:
    return tuple(
        pod(rank, state=PodState.FAILED, report=trip(node, onset=onset))
        for rank, node in enumerate(("node-a", "node-b"))
    )


def conditions(step: Transition) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in step.status.conditions}


def test_nan_trip_runs_the_whole_rollback_once() -> None:
    status = running()
    stop = advance(status, world(status, pods=tripped_pods()))
    assert stop.status.phase is Phase.STOPPING
    plan = stop.status.plan
    assert plan is not None
    assert (plan.action, plan.rule, plan.onset_step) == (Action.ROLLBACK, "nan", 55)
    assert plan.lr_scale == 0.5
    assert plan.added_skip == (SkipRange(first=53, last=60),)
    assert stop.status.counters.rollbacks == 1
    assert stop.status.counters.trips == 1
    assert stop.delete_pods == ("job-a0-0", "job-a0-1")
    assert not stop.force_delete
    assert conditions(stop)["Recovering"][0] == "True"

    pods_left = tripped_pods()
    again = advance(stop.status, world(stop.status, pods=pods_left, now=T0 + timedelta(seconds=5)))
    assert again.status.phase is Phase.STOPPING
    assert again.delete_pods
    assert not again.force_delete
    late = advance(stop.status, world(stop.status, pods=pods_left, now=T0 + timedelta(minutes=1)))
    assert late.force_delete, "pods that outlive the grace are force-deleted"

    planning = advance(stop.status, world(stop.status))
    assert planning.status.phase is Phase.PLANNING
    relaunching = advance(planning.status, world(planning.status))
    assert relaunching.status.phase is Phase.RELAUNCHING
    chosen = relaunching.status.plan
    assert chosen is not None
    assert chosen.target_step == 40, "newest stable checkpoint at or before onset 55 - 10"
    assert chosen.directives_generation == 2

    confirming = advance(relaunching.status, world(relaunching.status))
    assert confirming.status.phase is Phase.CONFIRMING
    launch = confirming.launch
    assert launch is not None
    directives = launch.directives
    assert (directives.attempt, directives.generation, directives.resume_step) == (1, 2, 40)
    assert directives.lr_scale == 0.5
    assert directives.rewarmup_steps == 4
    assert directives.skip == (SkipRange(first=53, last=60),)
    assert launch.preferred_nodes == ("node-a", "node-b")
    assert confirming.status.attempt == 1
    assert confirming.status.lr_scale == 0.5
    assert confirming.status.rollback_history[-1].to_step == 40
    assert confirming.recovered_after == timedelta(0)

    new_pods = (pod(0, attempt=1), pod(1, attempt=1))
    not_yet = [agent(r, attempt=1, step=40, generation=2, lr_scale=0.5) for r in (0, 1)]
    waiting = advance(
        confirming.status, world(confirming.status, pods=new_pods, scrapes=tuple(not_yet))
    )
    assert waiting.status.phase is Phase.CONFIRMING, "step 40 is not beyond the resume step"
    done = confirm_past(confirming.status, step=59)
    assert done.status.phase is Phase.RUNNING
    assert done.status.plan is None
    assert conditions(done)["Recovering"] == ("False", "RollbackConfirmed")
    assert done.status.counters.rollbacks == 1


def confirm_past(
    status: StableTrainingJobStatus, *, step: int, firing: tuple[FindingReport, ...] = (),
    seconds: float = 0.0,
) -> Transition:  # fmt: skip
    """One Confirming tick of attempt 1 whose pods both report `step` on the new directives."""
    pods = (pod(0, attempt=1), pod(1, attempt=1))
    scrapes = tuple(
        agent(r, attempt=1, step=step, generation=2, lr_scale=0.5, firing=firing) for r in (0, 1)
    )
    now = T0 + timedelta(seconds=seconds)
    return advance(status, world(status, pods=pods, scrapes=scrapes, now=now))


def relaunched_after_nan_trip() -> StableTrainingJobStatus:
    status = running(loss_baseline=1.6)
    step = advance(status, world(status, pods=tripped_pods()))
    for _ in range(3):  # Stopping -> Planning -> Relaunching -> Confirming
        step = advance(step.status, world(step.status, ledger=step.ledger))
    assert step.status.phase is Phase.CONFIRMING
    return step.status


def test_pods_already_being_deleted_are_not_asked_again_until_forced() -> None:
    status = running()
    stop = advance(status, world(status, pods=tripped_pods()))
    deleting = tuple(dataclasses.replace(p, deleting=True) for p in tripped_pods())
    soon = advance(stop.status, world(stop.status, pods=deleting, now=T0 + timedelta(seconds=5)))
    assert (soon.status.phase, soon.delete_pods) == (Phase.STOPPING, ())
    late = advance(stop.status, world(stop.status, pods=deleting, now=T0 + timedelta(minutes=1)))
    assert late.force_delete
    assert late.delete_pods == ("job-a0-0", "job-a0-1")


def test_pods_left_only_on_silent_nodes_are_forced_at_once() -> None:
    """Before: a lost node's pods waited out the grace period plus 10 s (15.7 s in the long
    chaos run). A live node's pod is still deleted gracefully first."""
    status = running()
    stop = advance(status, world(status, pods=tripped_pods()))
    live, lost = tripped_pods()
    silent = dataclasses.replace(lost, state=PodState.GONE, deleting=True, node_silent=True)
    both = advance(stop.status, world(stop.status, pods=(live, silent), now=T0))
    assert (both.delete_pods, both.force_delete) == (("job-a0-0",), False)
    alone = advance(stop.status, world(stop.status, pods=(silent,), now=T0))
    assert (alone.delete_pods, alone.force_delete) == (("job-a0-1",), True)


def test_confirming_lasts_until_the_old_onset_and_its_window_pass_quietly() -> None:
    """Before: Confirming ended at the first step past the resume step (41) on the new
    directives. After: it lasts until every pod is past onset 55 + nonFinite's 3-step window
    with the signal quiet, and the Event states the step and the loss against the baseline."""
    status = relaunched_after_nan_trip()
    plan = status.plan
    assert plan is not None
    assert (plan.confirm_step, plan.loss_baseline) == (58, 1.6)
    assert confirm_past(status, step=41).status.phase is Phase.CONFIRMING
    assert confirm_past(status, step=58).status.phase is Phase.CONFIRMING, "not past 58 yet"
    nan = FindingReport(signal="NonFinite", anomaly_class=AnomalyClass.NUMERICAL, onset_step=59,
                        consecutive=1, sustained=False)  # fmt: skip
    firing = confirm_past(status, step=60, firing=(nan,))
    assert firing.status.phase is Phase.CONFIRMING, "the signal fires: not quiet"
    done = confirm_past(status, step=60)
    assert done.status.phase is Phase.RUNNING
    (event,) = [e for e in done.events if e.reason == "RollbackConfirmed"]
    assert "passed step 58 (onset 55 + 3-step detection window) with NonFinite quiet" in (
        event.message
    )
    assert "loss 2 against the pre-spike baseline 1.6 (1.25x)" in event.message


def test_a_trip_while_confirming_is_the_same_incident_and_escalates() -> None:
    """Even when the new onset is further from the old one than escalation.withinSteps."""
    status = relaunched_after_nan_trip()
    recovery = spec().recovery.model_copy(
        update={"escalation": EscalationSpec(within_steps=0, max_recurrences=2)}
    )
    job = spec(recovery=recovery.model_dump(by_alias=True))
    pods = tuple(
        pod(rank, attempt=1, state=PodState.FAILED, report=trip(node, onset=50, attempt=1))
        for rank, node in enumerate(("node-a", "node-b"))
    )
    again = advance(status, world(status, spec=job, pods=pods))
    assert again.status.phase is Phase.STOPPING
    assert again.decision is not None
    assert (again.decision.reason, again.decision.escalation_level) == ("Escalated", 1)
    assert again.status.plan is not None
    assert again.status.plan.loss_baseline == 1.6, "still the level before the first spike"


def test_confirming_times_out_into_running_unconfirmed() -> None:
    status = relaunched_after_nan_trip()
    timeout = spec().recovery.confirm_timeout_seconds
    assert confirm_past(status, step=50, seconds=timeout - 1).status.phase is Phase.CONFIRMING
    late = confirm_past(status, step=50, seconds=timeout)
    assert late.status.phase is Phase.RUNNING
    assert conditions(late)["Recovering"] == ("False", "ConfirmationTimedOut")
    (event,) = late.events
    assert event.type == "Warning"
    assert "did not pass step 58" in event.message
    assert "it reached step 50" in event.message


def test_checkpoint_without_pfs_copy_is_passed_over() -> None:
    records = tuple(record(s, pfs=s != 40) for s in (10, 20, 30, 40, 50))
    status = running(checkpoints=records).model_copy(update={"phase": Phase.PLANNING})
    stop = advance(running(checkpoints=records), world(running(), pods=tripped_pods()))
    planning = stop.status.model_copy(update={"phase": Phase.PLANNING, "checkpoints": records})
    planned = advance(planning, world(status))
    assert planned.status.plan is not None
    assert planned.status.plan.target_step == 30


def test_inventory_in_trip_reports_reaches_the_choice() -> None:
    newer = (*CHECKPOINTS[:3], record(40, pfs=False))
    pods = tuple(
        pod(r, state=PodState.FAILED, report=trip(node, records=newer))
        for r, node in enumerate(("node-a", "node-b"))
    )
    status = running(checkpoints=())
    stop = advance(status, world(status, pods=pods))
    steps = [r.step for r in stop.status.checkpoints]
    assert steps == [10, 20, 30, 40]
    planning = advance(stop.status, world(stop.status))
    planned = advance(planning.status, world(planning.status))
    assert planned.status.plan is not None
    assert planned.status.plan.target_step == 30


def test_spent_rollback_budget_fails_with_the_reason() -> None:
    status = running(counters=Counters(rollbacks=2))
    stop = advance(status, world(status, pods=tripped_pods()))
    assert stop.status.plan is not None
    assert stop.status.plan.action is Action.FAIL
    failed = advance(stop.status, world(stop.status))
    assert failed.status.phase is Phase.FAILED
    state = conditions(failed)
    assert state["Failed"] == ("True", "RollbackBudgetExhausted")
    assert state["BudgetExhausted"][0] == "True"
    message = next(c.message for c in failed.status.conditions if c.type == "Failed")
    assert "maxRollbacks" in message or "rollback" in message.lower()
    assert message.endswith("evidence: loss is NaN"), "api.md: names the rule and the evidence"


def test_alert_changes_only_status_and_events() -> None:
    finding = FindingReport(
        signal="GradNormSpike", anomaly_class=AnomalyClass.DIVERGENCE, value=10.0,
        threshold=4.0, onset_step=50, consecutive=4, sustained=True, evidence="grad norm 10x",
    )  # fmt: skip
    scrapes = tuple(agent(r, step=57, firing=(finding,)) for r in (0, 1))
    status = running()
    alerted = advance(status, world(status, pods=(pod(0), pod(1)), scrapes=scrapes))
    assert alerted.status.phase is Phase.RUNNING
    assert alerted.status.counters.alerts == 1
    assert alerted.status.attempt == 0
    assert alerted.status.lr_scale == 1.0
    assert not alerted.delete_pods
    assert alerted.launch is None
    assert alerted.live is None
    assert conditions(alerted)["Healthy"] == ("False", "Alerted")
    (event,) = alerted.events
    assert (event.type, event.reason) == ("Warning", "Alerted")
    assert "rule grad alerts on GradNormSpike" in event.message
    assert event.message.endswith("evidence: grad norm 10x"), "api.md: the signal's evidence"
    repeat = advance(
        alerted.status,
        world(alerted.status, pods=(pod(0), pod(1)), scrapes=scrapes, ledger=alerted.ledger),
    )
    assert repeat.status.counters.alerts == 1, "one alert per episode"


def test_two_signals_alerting_in_one_scrape_both_alert_in_that_tick() -> None:
    """A loss spike and its grad-norm spike fire together; both rules alert. Deferred to
    the next tick, the second Alert is lost when its episode ended before that scrape (the
    loss spike's in test_live_policy_edit under CI load)."""
    rules = [
        {"name": "grad", "onSignals": ["GradNormSpike"], "action": "Alert"},
        {"name": "loss-spike", "onSignals": ["LossSpike"], "action": "Alert"},
        {"name": "nan", "onSignals": ["NonFinite"], "action": "Rollback"},
    ]
    job = spec(recovery={"rules": rules})
    firing = tuple(
        FindingReport(
            signal=signal,
            anomaly_class=AnomalyClass.DIVERGENCE,
            value=10.0,
            threshold=4.0,
            onset_step=50,
            consecutive=4,
            sustained=True,
            evidence=f"{signal} 10x",
        )
        for signal in ("GradNormSpike", "LossSpike")
    )
    scrapes = tuple(agent(r, step=57, firing=firing) for r in (0, 1))
    status = running()
    alerted = advance(status, world(status, spec=job, pods=(pod(0), pod(1)), scrapes=scrapes))
    assert alerted.status.phase is Phase.RUNNING
    assert alerted.status.counters.alerts == 2
    assert [(r.rule, r.signal) for r in alerted.status.rollback_history] == [
        ("grad", "GradNormSpike"),
        ("loss-spike", "LossSpike"),
    ]
    assert [e.reason for e in alerted.events] == ["Alerted", "Alerted"]
    repeat = advance(
        alerted.status,
        world(alerted.status, spec=job, pods=(pod(0), pod(1)), scrapes=scrapes,
              ledger=alerted.ledger),
    )  # fmt: skip
    assert repeat.status.counters.alerts == 2, "one alert per episode, each"


def test_a_firing_signal_that_changes_nothing_says_why_for_the_log() -> None:
    finding = FindingReport(
        signal="GradNormSpike", anomaly_class=AnomalyClass.DIVERGENCE, value=10.0,
        threshold=4.0, onset_step=50, consecutive=4, sustained=True, evidence="grad norm 10x",
    )  # fmt: skip
    scrapes = tuple(agent(r, step=57, firing=(finding,)) for r in (0, 1))
    status = running()
    alerted = advance(status, world(status, pods=(pod(0), pod(1)), scrapes=scrapes))
    assert alerted.deferred == ()
    repeat = advance(
        alerted.status,
        world(alerted.status, pods=(pod(0), pod(1)), scrapes=scrapes, ledger=alerted.ledger),
    )
    assert [(d.signal, d.message) for d in repeat.deferred] == [
        ("GradNormSpike", "rule grad already alerted on this episode of GradNormSpike (onset 50)")
    ]


def test_reduce_lr_sends_live_directives_without_restart() -> None:
    rules = [{"name": "grad", "onSignals": ["GradNormSpike"], "action": "ReduceLR"}]
    job = spec(recovery={"rules": rules})
    finding = FindingReport(
        signal="GradNormSpike", anomaly_class=AnomalyClass.LR_TOO_HIGH, onset_step=50,
        consecutive=4, sustained=True,
    )  # fmt: skip
    base = attempt_directives(job, generation=1, attempt=0, resume_step=None, lr_scale=1.0,
                              rewarmup_steps=0, skip=())  # fmt: skip
    status = running()
    scrapes = tuple(agent(r, firing=(finding,)) for r in (0, 1))
    step = advance(
        status,
        world(status, spec=job, pods=(pod(0), pod(1)), scrapes=scrapes, attempt_directives=base),
    )
    assert step.status.phase is Phase.RUNNING
    assert step.status.lr_scale == 0.5
    assert step.status.directives_generation == 2
    assert step.status.counters.lr_reductions == 1
    assert step.live is not None
    assert (step.live.generation, step.live.lr_scale, step.live.attempt) == (2, 0.5, 0)
    assert step.live_pods == ("job-a0-0", "job-a0-1")
    assert not step.delete_pods


def test_lagging_pod_gets_the_live_directives_again() -> None:
    job = spec()
    base = attempt_directives(job, generation=1, attempt=0, resume_step=None, lr_scale=1.0,
                              rewarmup_steps=0, skip=())  # fmt: skip
    status = running(directives_generation=2, lr_scale=0.5)
    scrapes = (agent(0, generation=2, lr_scale=0.5), agent(1, generation=1))
    step = advance(
        status, world(status, pods=(pod(0), pod(1)), scrapes=scrapes, attempt_directives=base)
    )
    assert step.live is not None
    assert step.live.generation == 2
    assert step.live_pods == ("job-a0-1",)


def test_a_lagging_pod_is_sent_the_live_directives_again_while_confirming() -> None:
    """api.md: a live change is retried until every pod applied it. Before, only while
    Running: one lost PUT during Confirming left the pod behind until the confirmation
    timed out."""
    confirming = relaunched_after_nan_trip()
    status = confirming.model_copy(
        update={"directives_generation": confirming.directives_generation + 1}
    )
    job = spec()
    base = attempt_directives(job, generation=confirming.directives_generation, attempt=1,
                              resume_step=50, lr_scale=status.lr_scale, rewarmup_steps=0,
                              skip=())  # fmt: skip
    new = status.directives_generation
    scrapes = (
        agent(0, attempt=1, step=52, generation=new, lr_scale=status.lr_scale),
        agent(1, attempt=1, step=52, generation=new - 1, lr_scale=status.lr_scale),
    )
    pods = (pod(0, attempt=1), pod(1, attempt=1))
    step = advance(status, world(status, pods=pods, scrapes=scrapes, attempt_directives=base))
    assert step.status.phase is Phase.CONFIRMING
    assert step.live is not None
    assert (step.live.generation, step.live.attempt) == (new, 1)
    assert step.live_pods == ("job-a1-1",)


def previous_restart(seconds_before: float) -> RollbackRecord:
    """A RestartFromLatest decided `seconds_before` T0."""
    return RollbackRecord(
        time=T0 - timedelta(seconds=seconds_before), action=Action.RESTART_FROM_LATEST,
        signal="WorkerFailure", from_step=30, to_step=25, lr_scale=1.0, attempt=0,
    )  # fmt: skip


def test_worker_failure_restarts_after_backoff_without_lr_change() -> None:
    status = running(counters=Counters(restarts=1), rollback_history=(previous_restart(10),))
    crashed = (pod(0, state=PodState.FAILED, reason="OOMKilled"), pod(1))
    stop = advance(status, world(status, pods=crashed))
    assert stop.status.plan is not None
    assert stop.status.plan.action is Action.RESTART_FROM_LATEST
    assert stop.status.counters.restarts == 2
    planning = advance(stop.status, world(stop.status))
    early = advance(planning.status, world(planning.status, now=T0 + timedelta(seconds=1)))
    assert early.status.phase is Phase.PLANNING, "backoff of 2 s for the second in a row"
    ready = advance(planning.status, world(planning.status, now=T0 + timedelta(seconds=3)))
    assert ready.status.plan is not None
    assert ready.status.plan.target_step == 50, "the newest checkpoint"
    assert ready.status.plan.lr_scale == 1.0


def test_the_backoff_doubles_over_restarts_in_a_row_not_over_the_jobs_life() -> None:
    """Counted over the job's life, the fifth restart of a long run waited 16 s."""
    crashed = (pod(0, state=PodState.FAILED, reason="OOMKilled"), pod(1))
    roomy = spec(recovery={"budgets": {"maxRestarts": 10}})

    def planning_after(*history: RollbackRecord) -> StableTrainingJobStatus:
        status = running(counters=Counters(restarts=len(history)), rollback_history=history)
        stop = advance(status, world(status, pods=crashed, spec=roomy))
        return advance(stop.status, world(stop.status, spec=roomy)).status

    def waits(status: StableTrainingJobStatus, seconds: float) -> bool:
        now = T0 + timedelta(seconds=seconds)
        later = advance(status, world(status, now=now, spec=roomy))
        assert later.status.phase in (Phase.PLANNING, Phase.RELAUNCHING), later.status.phase
        return later.status.phase is Phase.PLANNING

    hours_apart = planning_after(*(previous_restart(3600 * n) for n in (4, 3, 2, 1)))
    assert not waits(hours_apart, 1.0), "the fifth restart, the first in a while: 1 s"
    in_a_row = planning_after(previous_restart(70), previous_restart(25), previous_restart(5))
    assert waits(in_a_row, 3.9), "the third in a row (70 s is 45 s before the next) waits 4 s"
    assert not waits(in_a_row, 4.0)


def test_a_restart_resumes_from_a_checkpoint_saved_while_a_signal_fired() -> None:
    """api.md: RestartFromLatest takes the newest complete and verified checkpoint, stable or
    not. Before, with only a checkpoint saved while a signal fired, the restart failed the job
    with NoUsableCheckpoint; a rollback still refuses it."""
    saved_while_firing = (record(40, stable=False),)
    status = running(checkpoints=saved_while_firing)
    crashed = (pod(0, state=PodState.FAILED, reason="OOMKilled"), pod(1))
    stop = advance(status, world(status, pods=crashed))
    planning = advance(stop.status, world(stop.status))
    ready = advance(planning.status, world(planning.status, now=T0 + timedelta(seconds=3)))
    assert ready.status.phase is Phase.RELAUNCHING, ready.status.conditions
    assert ready.status.plan is not None
    assert ready.status.plan.target_step == 40
    rollback = running(checkpoints=saved_while_firing)
    tripped = advance(rollback, world(rollback, pods=tripped_pods()))
    stopped = advance(tripped.status, world(tripped.status))
    refused = advance(stopped.status, world(stopped.status))
    assert refused.status.phase is Phase.FAILED
    assert conditions(refused)["Failed"] == ("True", "NoUsableCheckpoint")
    (failed,) = [c for c in refused.status.conditions if c.type == "Failed"]
    assert "step 40 (not stable)" in failed.message


def test_pending_launches_attempt_zero() -> None:
    status = StableTrainingJobStatus()
    step = advance(status, world(status, previous_nodes=()))
    assert step.status.phase is Phase.RUNNING
    assert step.launch is not None
    assert (step.launch.directives.attempt, step.launch.directives.generation) == (0, 1)
    assert step.launch.directives.trip_on == ("NonFinite", "LossSpike")


def test_suspend_saves_first_then_stops_and_resume_relaunches_from_that_save() -> None:
    """Before: spec.suspend deleted the pods at once (the docs promised a final save). After:
    a live directive asks every pod to save now; the pods are stopped once each reports
    the checkpoint saved, and resuming starts from it."""
    status = running()
    suspended_spec = spec(suspend=True)
    base = attempt_directives(suspended_spec, generation=1, attempt=0, resume_step=None,
                              lr_scale=1.0, rewarmup_steps=0, skip=())  # fmt: skip
    pods = (pod(0), pod(1))
    asking = advance(status, world(status, spec=suspended_spec, pods=pods, attempt_directives=base))
    assert asking.status.phase is Phase.RUNNING
    assert not asking.delete_pods
    assert asking.live is not None
    assert (asking.live.generation, asking.live.save_request) == (2, 2)
    assert asking.live_pods == ("job-a0-0", "job-a0-1")
    assert conditions(asking)["Suspended"] == ("True", "SavingBeforeSuspend")
    saving = asking.status
    half = (agent(0, step=63, generation=2, saved_request=2, saved_step=63),
            agent(1, step=63, generation=2))  # fmt: skip
    waiting = advance(saving, world(saving, spec=suspended_spec, pods=pods, scrapes=half))
    assert waiting.status.phase is Phase.RUNNING, "one pod has not saved yet"
    both = tuple(
        agent(r, step=63, generation=2, records=(*CHECKPOINTS, record(63)), saved_request=2,
              saved_step=63)
        for r in (0, 1)
    )  # fmt: skip
    stopping = advance(saving, world(saving, spec=suspended_spec, pods=pods, scrapes=both))
    assert stopping.status.phase is Phase.STOPPING
    assert stopping.delete_pods == ("job-a0-0", "job-a0-1")
    (event,) = stopping.events
    assert "every pod saved the final checkpoint of step 63" in event.message
    suspended = advance(stopping.status, world(stopping.status, spec=suspended_spec))
    assert suspended.status.phase is Phase.SUSPENDED
    planning = advance(suspended.status, world(suspended.status))
    assert planning.status.phase is Phase.PLANNING
    planned = advance(planning.status, world(planning.status))
    assert planned.status.plan is not None
    assert planned.status.plan.target_step == 63, "the final checkpoint"
    relaunched = advance(planned.status, world(planned.status))
    assert relaunched.status.counters == Counters(), "resuming spends no budget"
    assert relaunched.status.rollback_history == ()


def test_suspend_while_a_rollback_is_confirmed_saves_and_stops_at_once() -> None:
    """Before: spec.suspend waited until the rollback was confirmed, or for
    recovery.confirmTimeoutSeconds (3 h by default)."""
    confirming = relaunched_after_nan_trip()
    job = spec(suspend=True)
    base = attempt_directives(job, generation=confirming.directives_generation, attempt=1,
                              resume_step=50, lr_scale=confirming.lr_scale, rewarmup_steps=0,
                              skip=())  # fmt: skip
    pods = (pod(0, attempt=1), pod(1, attempt=1))
    asking = advance(confirming, world(confirming, spec=job, pods=pods, attempt_directives=base))
    request = confirming.directives_generation + 1
    assert asking.live is not None
    assert asking.live.save_request == request
    saved = tuple(
        agent(r, attempt=1, step=53, generation=request, lr_scale=confirming.lr_scale,
              saved_request=request, saved_step=53)
        for r in (0, 1)
    )  # fmt: skip
    stopping = advance(asking.status, world(asking.status, spec=job, pods=pods, scrapes=saved))
    assert stopping.status.phase is Phase.STOPPING
    assert stopping.status.plan is None
    assert conditions(stopping)["Recovering"] == ("False", "Suspended")
    assert conditions(stopping)["Suspended"] == ("True", "Suspended")


def test_suspend_stops_the_pods_after_its_bound_without_an_answer() -> None:
    status = running()
    job = spec(suspend=True)
    base = attempt_directives(job, generation=1, attempt=0, resume_step=None, lr_scale=1.0,
                              rewarmup_steps=0, skip=())  # fmt: skip
    pods = (pod(0), pod(1))
    saving = advance(status, world(status, spec=job, pods=pods, attempt_directives=base)).status
    silent = tuple(agent(r, step=63, generation=1) for r in (0, 1))
    soon = T0 + timedelta(seconds=119)
    early = advance(
        saving,
        world(saving, spec=job, pods=pods, scrapes=silent, attempt_directives=base, now=soon),
    )
    assert early.status.phase is Phase.RUNNING
    assert early.live is not None, "pods that did not apply the request get it again"
    assert early.live_pods == ("job-a0-0", "job-a0-1")
    bound = T0 + timedelta(seconds=120)
    late = advance(saving, world(saving, spec=job, pods=pods, scrapes=silent, now=bound))
    assert late.status.phase is Phase.STOPPING
    assert late.delete_pods == ("job-a0-0", "job-a0-1")
    assert "0 of 2 pod(s) saved a final checkpoint within 120 s" in late.events[0].message


@pytest.mark.parametrize("phase", [Phase.STOPPING, Phase.PLANNING, Phase.RELAUNCHING])
def test_every_step_is_repeatable(phase: Phase) -> None:
    """Advancing the same persisted status twice gives the same next status and effects:
    an operator killed after a write and restarted repeats the step, not the action."""
    status = running()
    step = advance(status, world(status, pods=tripped_pods()))
    while step.status.phase is not phase:
        step = advance(step.status, world(step.status))
    first = advance(step.status, world(step.status))
    second = advance(step.status, world(step.status))
    assert first.status == second.status
    assert first.launch == second.launch
    assert first.status.counters == step.status.counters


def test_status_of_a_nan_trip_is_valid_json_for_the_api_server() -> None:
    nan_trip = trip("node-a").model_copy(update={"value": float("nan"), "threshold": 1.0})
    pods = tuple(pod(r, state=PodState.FAILED, report=nan_trip) for r in (0, 1))
    status = running()
    stopped = advance(status, world(status, pods=pods))
    body = json.dumps(status_json(stopped.status), allow_nan=False)
    assert json.loads(body)["lastTrip"]["value"] is None
    assert json.loads(body)["lastTrip"]["threshold"] == 1.0


def test_manual_rollback_runs_once_per_request_id() -> None:
    manual = {"requestId": "fix-1", "toStep": 30, "lrFactor": 0.25, "reason": "bad data"}
    job = spec(manualRollback=manual)
    status = running()
    stop = advance(status, world(status, spec=job, pods=(pod(0), pod(1))))
    assert stop.status.plan is not None
    assert (stop.status.plan.action, stop.status.plan.request_id) == (Action.ROLLBACK, "fix-1")
    assert stop.status.last_manual_request_id == "fix-1"
    (event,) = stop.events
    assert event.message.endswith("evidence: bad data"), "api.md: the reason is in the Event"
    step = stop
    while step.status.phase is not Phase.CONFIRMING:
        step = advance(step.status, world(step.status, spec=job))
    assert step.launch is not None
    assert step.launch.directives.resume_step == 30
    assert step.launch.directives.lr_scale == 0.25
    new_pods = (pod(0, attempt=1), pod(1, attempt=1))
    applied = tuple(agent(r, attempt=1, step=31, generation=2, lr_scale=0.25) for r in (0, 1))
    done = advance(step.status, world(step.status, spec=job, pods=new_pods, scrapes=applied))
    assert done.status.phase is Phase.RUNNING
    again = advance(done.status, world(done.status, spec=job, pods=new_pods, scrapes=applied))
    assert again.status.phase is Phase.RUNNING, "the same request id does not run twice"
    assert again.status.counters.rollbacks == 1


def test_policy_ledger_travels_in_status() -> None:
    finding = FindingReport(
        signal="GradNormSpike", anomaly_class=AnomalyClass.DIVERGENCE, onset_step=50,
        consecutive=4, sustained=True,
    )  # fmt: skip
    scrapes = tuple(agent(r, step=57, firing=(finding,)) for r in (0, 1))
    status = running()
    alerted = advance(status, world(status, pods=(pod(0), pod(1)), scrapes=scrapes))
    assert alerted.status.policy_ledger is not None
    restored = PolicyLedger.from_status(alerted.status.policy_ledger)
    assert restored == alerted.ledger
    assert restored.episode_handled("grad", "GradNormSpike", 50)


def test_skip_list_too_long_for_status_spills_into_a_config_map() -> None:
    earlier = tuple(SkipRange(first=1000 * i, last=1000 * i + 10) for i in range(1, 65))
    status = running(active_skip_ranges=earlier, skip_ranges_total=64)
    step = advance(status, world(status, pods=tripped_pods(), skip_ranges=earlier))
    while step.status.phase is not Phase.CONFIRMING:
        step = advance(step.status, world(step.status, skip_ranges=earlier))
    assert step.launch is not None
    assert step.launch.spill_skip_ranges is not None
    assert len(step.launch.spill_skip_ranges) == 65
    assert step.launch.directives.skip == step.launch.spill_skip_ranges
    assert step.status.skip_ranges_config_map == "job-skip-ranges"
    assert step.status.skip_ranges_total == 65
    assert len(step.status.active_skip_ranges) == 64


def test_trip_report_arriving_after_a_scrape_decision_is_counted_once() -> None:
    finding = FindingReport(
        signal="NonFinite", anomaly_class=AnomalyClass.NUMERICAL, onset_step=55,
        consecutive=1, sustained=True,
    )  # fmt: skip
    scrapes = tuple(agent(r, step=56, firing=(finding,)) for r in (0, 1))
    status = running()
    stop = advance(status, world(status, pods=(pod(0), pod(1)), scrapes=scrapes))
    assert stop.status.phase is Phase.STOPPING
    assert stop.status.counters.trips == 0
    late = advance(stop.status, world(stop.status, pods=tripped_pods()))
    assert late.status.counters.trips == 1
    assert late.status.last_trip is not None
    again = advance(late.status, world(late.status, pods=tripped_pods()))
    assert again.status.counters.trips == 1


def test_a_trip_the_scrape_carries_is_counted_at_the_decision_and_only_once() -> None:
    """The agent tripped and said so in its status: the pods are stopped before their
    termination messages are read (seen in CI under load), and the trip still counts."""
    finding = FindingReport(
        signal="NonFinite", anomaly_class=AnomalyClass.NUMERICAL, onset_step=55,
        consecutive=3, sustained=True,
    )  # fmt: skip
    scrapes = tuple(
        agent(r, step=57, firing=(finding,), latest_trip=trip(NODES[r])) for r in (0, 1)
    )
    status = running()
    stop = advance(status, world(status, pods=(pod(0), pod(1)), scrapes=scrapes))
    assert stop.status.phase is Phase.STOPPING
    assert stop.status.counters.trips == 1
    assert stop.status.last_trip == trip(NODES[0])
    late = advance(stop.status, world(stop.status, pods=tripped_pods()))
    assert late.status.counters.trips == 1


def test_a_rollback_decided_from_a_scrape_skips_the_shards_its_trip_report_names() -> None:
    """Before: a scrape that carried the trip report decided from its finding alone, so the
    skip list lost the report's suspect shards (the poisoned-shard e2e test, CI stop 22).
    After: the scraped report is the observation, shards and all."""
    finding = FindingReport(
        signal="LossSpike", anomaly_class=AnomalyClass.DIVERGENCE, onset_step=55,
        consecutive=4, sustained=True,
    )  # fmt: skip
    shards = ("shard-0008", "shard-0007")
    scrapes = tuple(
        agent(
            r, step=58, firing=(finding,),
            latest_trip=trip(NODES[r], step=58, signal="LossSpike").model_copy(
                update={"anomaly_class": AnomalyClass.DIVERGENCE, "suspect_shards": shards}
            ),
        )
        for r in (0, 1)
    )  # fmt: skip
    status = running(step=58)
    stop = advance(status, world(status, pods=(pod(0), pod(1)), scrapes=scrapes))
    assert stop.status.phase is Phase.STOPPING
    assert stop.status.plan is not None
    (skip,) = stop.status.plan.added_skip
    assert skip.shard_ids == shards


def test_a_shard_suspected_again_is_skipped_to_the_end_of_the_run() -> None:
    """Before: the long chaos run's poisoned shard-0228, skipped in steps 3599-3899 by the
    first rollback, was read again on the next pass and tripped a second rollback at 8449;
    a third pass would trip again. After: the second rollback skips it for good."""
    finding = FindingReport(
        signal="LossSpike", anomaly_class=AnomalyClass.DIVERGENCE, onset_step=55,
        consecutive=4, sustained=True,
    )  # fmt: skip
    suspects = {"anomaly_class": AnomalyClass.DIVERGENCE,
                "suspect_shards": ("shard-0228", "shard-0227")}  # fmt: skip
    scrapes = tuple(
        agent(r, step=58, firing=(finding,),
              latest_trip=trip(NODES[r], step=58, signal="LossSpike").model_copy(update=suspects))
        for r in (0, 1)
    )  # fmt: skip
    earlier = SkipRange(first=3, last=9, shard_ids=("shard-0228", "shard-0229"))
    status = running(step=58)
    stop = advance(
        status, world(status, pods=(pod(0), pod(1)), scrapes=scrapes, skip_ranges=(earlier,))
    )
    assert stop.status.plan is not None
    for_good, around = stop.status.plan.added_skip
    assert for_good == SkipRange(first=0, last=RUN_END, unit=SkipUnit.BATCH,
                                 shard_ids=("shard-0228",))  # fmt: skip
    assert around.shard_ids == ("shard-0228", "shard-0227")
    first_time = advance(status, world(status, pods=(pod(0), pod(1)), scrapes=scrapes))
    assert first_time.status.plan is not None
    assert [r.to_run_end for r in first_time.status.plan.added_skip] == [False]


def test_a_trip_waits_briefly_for_the_reports_of_the_ranks_still_running() -> None:
    """Before: the first report decided and the other pods were stopped before theirs, so
    the plan lacked their nodes' newest checkpoints (the HF e2e test on a fast machine).
    After: up to 10 s for the others' reports; then it decides on what it has."""
    finding = FindingReport(
        signal="NonFinite", anomaly_class=AnomalyClass.NUMERICAL, onset_step=55,
        consecutive=3, sustained=True,
    )  # fmt: skip
    first = agent(0, step=57, firing=(finding,), latest_trip=trip(NODES[0]))
    status = running()
    pods = (pod(0), pod(1))
    waiting = advance(status, world(status, pods=pods, scrapes=(first, agent(1, step=57))))
    assert waiting.status.phase is Phase.RUNNING
    both = (first, agent(1, step=57, firing=(finding,), latest_trip=trip(NODES[1])))
    stop = advance(status, world(status, pods=pods, scrapes=both))
    assert stop.status.phase is Phase.STOPPING
    late = T0 + timedelta(seconds=11)
    alone = advance(status, world(status, pods=pods, scrapes=(first, agent(1)), now=late))
    assert alone.status.phase is Phase.STOPPING


def test_live_and_fail_decisions_are_in_the_history() -> None:
    """Before: rollbackHistory held only the actions that relaunched (Rollback, Restart);
    an Alert, a ReduceLR and the Fail that ended a job left no entry. After: each does."""
    finding = FindingReport(
        signal="GradNormSpike", anomaly_class=AnomalyClass.DIVERGENCE, onset_step=50,
        consecutive=4, sustained=True, evidence="grad norm 10x",
    )  # fmt: skip
    scrapes = tuple(agent(r, step=57, firing=(finding,)) for r in (0, 1))
    status = running()
    alerted = advance(status, world(status, pods=(pod(0), pod(1)), scrapes=scrapes))
    (alert,) = alerted.status.rollback_history
    assert (alert.action, alert.reason, alert.rule, alert.signal) == (
        Action.ALERT, "Alerted", "grad", "GradNormSpike",
    )  # fmt: skip
    assert (alert.onset_step, alert.from_step, alert.to_step, alert.attempt) == (50, 57, None, 0)

    rules = [{"name": "grad", "onSignals": ["GradNormSpike"], "action": "ReduceLR"}]
    job = spec(recovery={"rules": rules})
    reduced = advance(status, world(status, spec=job, pods=(pod(0), pod(1)), scrapes=scrapes))
    (reduce_lr,) = reduced.status.rollback_history
    assert (reduce_lr.action, reduce_lr.reason, reduce_lr.lr_scale) == (
        Action.REDUCE_LR, "LRReduced", 0.5,
    )  # fmt: skip

    spent = running(counters=Counters(rollbacks=2))
    stop = advance(spent, world(spent, pods=tripped_pods()))
    failed = advance(stop.status, world(stop.status))
    (fail,) = failed.status.rollback_history
    assert (fail.action, fail.reason, fail.rule, fail.onset_step, fail.from_step) == (
        Action.FAIL, "RollbackBudgetExhausted", "nan", 55, 57,
    )  # fmt: skip
    assert status_json(failed.status)["rollbackHistory"][0]["action"] == "Fail"


def test_no_usable_checkpoint_is_recorded_as_the_fail_it_is() -> None:
    status = running(checkpoints=tuple(record(s, pfs=False) for s in (10, 20, 30)))
    stop = advance(status, world(status, pods=tripped_pods()))
    planning = advance(stop.status, world(stop.status))
    failed = advance(planning.status, world(planning.status))
    assert failed.status.phase is Phase.FAILED
    (fail,) = failed.status.rollback_history
    assert (fail.action, fail.reason, fail.rule) == (Action.FAIL, "NoUsableCheckpoint", "nan")


def test_training_complete_while_confirming_confirms_the_rollback() -> None:
    status = relaunched_after_nan_trip()
    finished = tuple(pod(r, attempt=1, state=PodState.SUCCEEDED) for r in (0, 1))
    done = advance(status, world(status, pods=finished))
    assert done.status.phase is Phase.SUCCEEDED
    assert conditions(done)["Recovering"] == ("False", "RollbackConfirmed")
    assert [e.reason for e in done.events] == ["RollbackConfirmed", "TrainingComplete"]
    assert "past step 58 without a trip" in done.events[0].message
