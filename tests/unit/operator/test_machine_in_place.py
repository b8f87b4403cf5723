"""Recoveries in place (recovery.restart InPlace): the state machine keeps the supervised pods
that can run the next attempt, stops their processes, and starts the next attempt in them;
only the pods that must go are deleted and created anew."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime, timedelta

from operator_builders import NODES, T0, agent, pod, record, spec, trip
from test_machine_queue import ADMITTED, EVICTED

from stabletrain_contract.checkpoint.inventory import PodCopy, TierCopy
from stabletrain_contract.names import Action
from stabletrain_contract.restore import render_restore_failure
from stabletrain_contract.supervisor import ProcessState, SupervisorReport
from stabletrain_contract.trip_report import render_termination_message
from stabletrain_operator.api.constants import Phase, Reason
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus, SuspectNode
from stabletrain_operator.machine import Transition, World, advance, stop_force_after
from stabletrain_operator.observe.pod_facts import PodFacts, PodState
from stabletrain_operator.observe.supervised import with_reports
from stabletrain_operator.pods import pod_shape
from stabletrain_operator.policy import PolicyLedger

CHECKPOINTS = tuple(record(step) for step in (10, 20, 30, 40, 50))
KILLED = "exitcode  : -9 (pid: 77)\nsignal    : 9 (SIGKILL)"


def in_place_spec(**recovery: object) -> StableTrainingJobSpec:
    base = spec()
    rules = [rule.model_dump(by_alias=True, mode="json") for rule in base.recovery.rules]
    return spec(
        recovery={
            "rules": rules,
            "budgets": {"maxRollbacks": 2, "maxRestarts": 2, "cooldownSeconds": 0},
            "restart": "InPlace",
            **recovery,
        }
    )


SPEC = in_place_spec()


def supervised(
    rank: int, *, attempt: int = 0, name: str | None = None, **changes: object
) -> PodFacts:
    base = pod(rank % len(NODES), attempt=attempt)
    settings: dict[str, object] = {
        "name": name or f"job-a{attempt}-{rank}",
        "rank": rank,
        "supervised": True,
        "ready": True,
        "shape": pod_shape(SPEC),
        **changes,
    }
    return dataclasses.replace(base, **settings)  # type: ignore[arg-type]


def report(
    attempt: int,
    state: ProcessState,
    *,
    code: int | None = 1,
    message: str = "",
    ended: datetime | None = T0,
) -> SupervisorReport:
    return SupervisorReport(
        attempt=attempt,
        state=state,
        started_at=T0 - timedelta(minutes=5),
        ended_at=ended if state is not ProcessState.RUNNING else None,
        exit_code=code if state is not ProcessState.RUNNING else None,
        message=message,
        attempts_started=1,
    )


def world(
    status: StableTrainingJobStatus,
    pods: tuple[PodFacts, ...],
    reports: Mapping[str, SupervisorReport] = {},
    **changes: object,
) -> World:
    base: dict[str, object] = {
        "now": T0,
        "job": "job",
        "spec": SPEC,
        "generation": 1,
        "pods": tuple(with_reports(pods, reports)),
        "supervisors": dict(reports),
        "ledger": PolicyLedger.from_job_status(status),
        "previous_nodes": NODES,
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
        "attempt_progressed": True,
    }
    data.update(changes)
    return StableTrainingJobStatus(**data)  # type: ignore[arg-type]


def killed_rank_one() -> tuple[tuple[PodFacts, ...], dict[str, SupervisorReport]]:
    """Rank 1's worker SIGKILLed: its supervisor reports the attempt ended, the container
    runs on; rank 0's processes end on the broken collective a moment later."""
    pods = (supervised(0), supervised(1))
    reports = {
        "job-a0-0": report(0, ProcessState.EXITED, message="RuntimeError: gloo connection closed"),
        "job-a0-1": report(0, ProcessState.EXITED, message=KILLED),
    }
    return pods, reports


def test_a_restart_keeps_the_supervised_pods_and_starts_the_next_attempt_in_them() -> None:
    pods, reports = killed_rank_one()
    status = running()
    stop = advance(status, world(status, pods, reports))
    plan = stop.status.plan
    assert plan is not None
    assert (plan.action, plan.in_place, plan.replaced_ranks) == (
        Action.RESTART_FROM_LATEST, True, ()
    )  # fmt: skip
    assert stop.delete_pods == ()
    assert (stop.stop_pods, stop.stop_attempt) == (("job-a0-0", "job-a0-1"), 0)
    ready = {c.type: c.message for c in stop.status.conditions}["Ready"]
    assert "2 of 2 pod(s) restart in place, 0 replaced" in ready
    # The killed rank's node is a suspect now, but its first incident does not condemn it.
    assert [n.node for n in stop.status.suspect_nodes] == ["node-b"]

    # Both processes already ended (the reports say so): straight on to Planning.
    planning = advance(stop.status, world(stop.status, pods, reports))
    assert planning.status.phase is Phase.PLANNING
    assert planning.delete_pods == ()
    step = planning
    while step.status.phase is not Phase.CONFIRMING:
        step = advance(step.status, world(step.status, pods, reports, now=T0 + timedelta(1)))
    assert step.launch is not None
    assert step.launch.in_place == ((0, "job-a0-0"), (1, "job-a0-1"))
    assert step.launch.directives.attempt == 1
    (entry,) = step.status.rollback_history
    assert (entry.restarted_in_place, entry.replaced_pods, entry.replaced_ranks) == (2, 0, ())
    (relaunched,) = [e for e in step.events if e.reason == "Relaunched"]
    assert "2 restarted in place (job-a0-0, job-a0-1), 0 replaced" in relaunched.message


def test_a_kept_pod_is_told_to_stop_until_its_supervisor_says_it_stopped() -> None:
    pods = (supervised(0), supervised(1, state=PodState.FAILED, exit_code=137))
    status = running()
    stop = advance(status, world(status, pods))
    assert stop.delete_pods == ("job-a0-1",), "its container ended: the pod must go"
    assert stop.stop_pods == ("job-a0-0",)
    assert stop.status.plan is not None
    assert stop.status.plan.replaced_ranks == (1,)
    (replaced,) = [e for e in stop.events if e.reason == Reason.POD_REPLACED]
    assert "job-a0-1 (rank 1) is replaced: its container no longer runs" in replaced.message
    # Rank 0 still runs: the stop is sent again; rank 1's pod is still there.
    still = {"job-a0-0": report(0, ProcessState.STOPPING)}
    waiting = advance(stop.status, world(stop.status, pods, still))
    assert waiting.status.phase is Phase.STOPPING
    assert waiting.stop_pods == ("job-a0-0",)
    assert waiting.delete_pods == ("job-a0-1",)
    # Rank 0 stopped, rank 1's pod is gone: Planning.
    done = {"job-a0-0": report(0, ProcessState.STOPPED, code=143)}
    planning = advance(waiting.status, world(waiting.status, pods[:1], done))
    assert planning.status.phase is Phase.PLANNING
    step = planning
    while step.status.phase is not Phase.CONFIRMING:
        step = advance(step.status, world(step.status, pods[:1], done, now=T0 + timedelta(1)))
    assert step.launch is not None
    assert step.launch.in_place == ((0, "job-a0-0"),)
    assert step.status.rollback_history[-1].replaced_ranks == (1,)


def test_processes_that_do_not_stop_in_time_or_survive_kill_get_their_pod_replaced() -> None:
    pods, reports = killed_rank_one()
    status = running()
    stop = advance(status, world(status, pods, reports))
    hung = {
        "job-a0-0": report(0, ProcessState.STOPPING),
        "job-a0-1": report(0, ProcessState.UNKILLABLE, code=None),
    }
    unkillable = advance(stop.status, world(stop.status, pods, hung))
    assert unkillable.delete_pods == ("job-a0-1",)
    assert unkillable.stop_pods == ("job-a0-0",)
    assert unkillable.status.plan is not None
    assert unkillable.status.plan.replaced_ranks == (1,)
    (event,) = unkillable.events
    assert (event.type, event.reason) == ("Warning", Reason.POD_REPLACED)
    assert "survived KILL" in event.message
    late = T0 + stop_force_after(SPEC)
    overdue = advance(unkillable.status, world(unkillable.status, pods, hung, now=late))
    assert set(overdue.delete_pods) == {"job-a0-0", "job-a0-1"}
    assert overdue.force_delete
    assert overdue.status.plan is not None
    assert overdue.status.plan.replaced_ranks == (0, 1)
    assert "did not stop within the grace period" in overdue.events[0].message


def test_pods_that_cannot_run_the_next_attempt_are_replaced_with_the_reason() -> None:
    silent = supervised(0, node_silent=True)
    old_shape = supervised(1, shape="0123456789abcdef")
    status = running()
    pods = (silent, old_shape)
    failed = {"job-a0-1": report(0, ProcessState.EXITED, message=KILLED)}
    stop = advance(status, world(status, pods, failed))
    assert stop.delete_pods == ("job-a0-0", "job-a0-1")
    assert stop.stop_pods == ()
    reasons = sorted(e.message for e in stop.events if e.reason == Reason.POD_REPLACED)
    assert "its node node-a stopped reporting" in reasons[0]
    assert "workers, tiers, memory tier or warm start changed since it was created" in reasons[1]


def test_a_node_with_repeated_incidents_loses_its_pod_a_first_one_does_not() -> None:
    pods, reports = killed_rank_one()
    once = SuspectNode(
        node="node-b", incidents=1, last_reason="killed", last_incident_at=T0,
        expires_at=T0 + timedelta(hours=1),
    )  # fmt: skip
    status = running(suspect_nodes=(once,))
    stop = advance(status, world(status, pods, reports))
    assert stop.status.suspect_nodes[0].incidents == 2
    assert stop.delete_pods == ("job-a0-1",)
    assert stop.stop_pods == ("job-a0-0",)
    (event,) = [e for e in stop.events if e.reason == Reason.POD_REPLACED]
    assert "node-b is a suspect of repeated incidents" in event.message


def test_recreate_pods_deletes_every_pod_as_before() -> None:
    pods, reports = killed_rank_one()
    status = running()
    recreate = in_place_spec(restart="RecreatePods")
    stop = advance(status, world(status, pods, reports, spec=recreate))
    assert stop.status.plan is not None
    assert not stop.status.plan.in_place
    assert stop.delete_pods == ("job-a0-0", "job-a0-1")
    assert stop.stop_pods == ()


def test_a_fail_deletes_every_pod_whatever_the_restart_mode() -> None:
    pods = (supervised(0), supervised(1))
    reports = {
        n: report(0, ProcessState.EXITED, message=f"trip {n}") for n in ("job-a0-0", "job-a0-1")
    }
    status = running(counters={"restarts": 2})
    stop = advance(status, world(status, pods, reports))
    assert stop.status.plan is not None
    assert stop.status.plan.action is Action.FAIL
    assert stop.delete_pods == ("job-a0-0", "job-a0-1")


def test_a_relaunch_repeated_after_its_pods_were_relabelled_launches_the_same() -> None:
    """An operator killed after the relaunch relabelled the kept pods but before its status
    write repeats the same launch: the relabelled pods are still the kept ones."""
    pods, reports = killed_rank_one()
    step: Transition = advance(running(), world(running(), pods, reports))
    while step.status.phase is not Phase.RELAUNCHING:
        step = advance(step.status, world(step.status, pods, reports, now=T0 + timedelta(1)))
    first = advance(step.status, world(step.status, pods, reports, now=T0 + timedelta(1)))
    relabelled = tuple(dataclasses.replace(p, attempt=1) for p in pods)
    again = advance(step.status, world(step.status, relabelled, reports, now=T0 + timedelta(1)))
    assert first.launch == again.launch
    assert first.status == again.status


def test_a_start_order_that_did_not_arrive_is_sent_again_while_confirming() -> None:
    pods, reports = killed_rank_one()
    step: Transition = advance(running(), world(running(), pods, reports))
    while step.status.phase is not Phase.CONFIRMING:
        step = advance(step.status, world(step.status, pods, reports, now=T0 + timedelta(1)))
    relabelled = tuple(dataclasses.replace(p, attempt=1) for p in pods)
    started = {
        "job-a0-0": report(1, ProcessState.RUNNING),
        "job-a0-1": reports["job-a0-1"],
    }
    scrape = (agent(0, attempt=1, step=51, generation=2),)
    confirming = advance(
        step.status, world(step.status, relabelled, started, scrapes=scrape, now=T0)
    )
    assert confirming.start_pods == ("job-a0-1",)
    both = {**started, "job-a0-1": report(1, ProcessState.RUNNING)}
    settled = advance(step.status, world(step.status, relabelled, both, scrapes=scrape))
    assert settled.start_pods == ()


def test_a_supervised_attempt_that_ended_reads_as_the_container_that_ended() -> None:
    tripped = trip("node-b", step=57)

    pods = (supervised(0), supervised(1), supervised(2, attempt=1))
    reports = {
        "job-a0-0": report(0, ProcessState.EXITED, code=0, message="done"),
        "job-a0-1": report(0, ProcessState.EXITED, message=render_termination_message(tripped)),
        "job-a1-2": report(0, ProcessState.EXITED),
    }
    seen = with_reports(pods, reports)
    assert (seen[0].state, seen[0].reason, seen[0].processes_ended) == (
        PodState.SUCCEEDED, "Completed", True
    )  # fmt: skip
    assert seen[1].state is PodState.FAILED
    assert seen[1].trip == tripped
    assert seen[1].finished_at == T0
    assert seen[1].container_running
    assert seen[2] == pods[2], "a report of another attempt says nothing about this one"


def test_the_same_kill_on_the_same_node_after_an_in_place_restart_leaves_the_node() -> None:
    """Not a crash loop: the relaunch kept the killed rank's pod (the node's first incident);
    the same kill there again is the node's second, and the next relaunch leaves it."""
    pods, reports = killed_rank_one()
    step: Transition = advance(running(), world(running(), pods, reports))
    while step.status.phase is not Phase.CONFIRMING:
        step = advance(
            step.status, world(step.status, pods, reports, now=T0 + timedelta(seconds=30))
        )
    again = tuple(dataclasses.replace(p, attempt=1) for p in pods)
    later = T0 + timedelta(minutes=5)
    killed_again = {
        "job-a0-0": report(1, ProcessState.EXITED, message="RuntimeError: gloo connection closed"),
        "job-a0-1": report(1, ProcessState.EXITED, message=KILLED),
    }
    status = step.status.model_copy(update={"phase": Phase.RUNNING, "step": 57})
    second = advance(status, world(status, again, killed_again, now=later))
    plan = second.status.plan
    assert plan is not None
    assert plan.action is Action.RESTART_FROM_LATEST, second.status.conditions
    assert [(n.node, n.incidents) for n in second.status.suspect_nodes] == [("node-b", 2)]
    assert second.delete_pods == ("job-a0-1",)
    assert second.stop_pods == ("job-a0-0",)
    assert plan.replaced_ranks == (1,)


def test_a_restart_in_place_restores_the_snapshot_every_kept_pod_holds_in_memory() -> None:
    in_memory = record(55).model_copy(
        update={
            "pfs": TierCopy(),
            "local": (),
            "memory": tuple(
                PodCopy(pod=name, complete=True, verified=True) for name in ("job-a0-0", "job-a0-1")
            ),
        }
    )
    pods, reports = killed_rank_one()
    status = running(checkpoints=(*CHECKPOINTS, in_memory))
    step: Transition = advance(status, world(status, pods, reports))
    while step.status.phase is not Phase.RELAUNCHING:
        step = advance(step.status, world(step.status, pods, reports, now=T0 + timedelta(1)))
    plan = step.status.plan
    assert plan is not None
    assert plan.target_step == 55, plan.checkpoint_choice
    assert "memory tier" in plan.checkpoint_choice
    # Rank 1's pod replaced (its node left): its memory is gone, the local tier's 50 it is.
    lost = SuspectNode(
        node="node-b", incidents=1, last_reason="killed", last_incident_at=T0,
        expires_at=T0 + timedelta(hours=1),
    )  # fmt: skip
    status = running(checkpoints=(*CHECKPOINTS, in_memory), suspect_nodes=(lost,))
    step = advance(status, world(status, pods, reports))
    while step.status.phase is not Phase.RELAUNCHING:
        step = advance(step.status, world(step.status, pods[:1], reports, now=T0 + timedelta(1)))
    assert step.status.plan is not None
    assert step.status.plan.target_step == 50


def test_a_restore_failure_after_an_in_place_relaunch_is_a_fresh_stop() -> None:
    """The re-plan keeps every pod that can run the next attempt: the rank whose pod the
    relaunch replaced has a new, healthy one now, kept like the other (before: the old plan's
    replaced ranks carried over, and that pod was deleted again with no PodReplaced Event)."""
    pods, reports = killed_rank_one()
    twice = SuspectNode(
        node="node-b", incidents=1, last_reason="killed", last_incident_at=T0,
        expires_at=T0 + timedelta(hours=1),
    )  # fmt: skip
    status = running(suspect_nodes=(twice,))
    step: Transition = advance(status, world(status, pods, reports))
    assert step.delete_pods == ("job-a0-1",)
    kept = (pods[0],)
    for _ in range(5):
        if step.status.phase is Phase.CONFIRMING:
            break
        step = advance(step.status, world(step.status, kept, reports, now=T0 + timedelta(1)))
    plan = step.status.plan
    assert plan is not None
    assert plan.target_step is not None
    assert plan.replaced_ranks == (1,)
    relaunched = (
        dataclasses.replace(pods[0], attempt=1),
        supervised(1, attempt=1, node="node-c"),
    )
    failed = {
        "job-a0-0": report(1, ProcessState.EXITED,
                           message=render_restore_failure(plan.target_step, 1, "torn")),
        "job-a1-1": report(1, ProcessState.RUNNING),
    }  # fmt: skip
    again = advance(step.status, world(step.status, relaunched, failed, now=T0 + timedelta(1)))
    replanned = again.status.plan
    assert replanned is not None
    assert [e.reason for e in again.events] == [Reason.RESTORE_FAILED]
    assert (replanned.excluded_steps, replanned.next_attempt) == ((plan.target_step,), 2)
    assert again.delete_pods == ()
    assert again.stop_pods == ("job-a0-0", "job-a1-1")
    assert (replanned.in_place, replanned.replaced_ranks) == (True, ())


def test_an_eviction_during_an_in_place_recovery_lets_the_kept_pods_go_too() -> None:
    """Kueue takes its quota back only once no pod holds a node: the pods kept for the
    relaunch are deleted while the plan waits, and the readmitted relaunch creates them all
    (before: they stayed, and the job waited in Relaunching for good)."""
    pods, reports = killed_rank_one()
    status = running()
    step: Transition = advance(status, world(status, pods, reports, admission=ADMITTED))
    later = T0 + timedelta(1)
    for _ in range(5):
        if step.status.phase is Phase.RELAUNCHING:
            break
        step = advance(step.status, world(step.status, pods, reports, admission=EVICTED, now=later))
    assert step.status.phase is Phase.RELAUNCHING
    held = advance(step.status, world(step.status, pods, reports, admission=EVICTED, now=later))
    assert held.launch is None
    assert held.delete_pods == ("job-a0-0", "job-a0-1")
    assert held.status.plan == step.status.plan, "the plan waits for the next admission"
    going = tuple(dataclasses.replace(p, deleting=True) for p in pods)
    assert (
        advance(
            held.status, world(held.status, going, reports, admission=EVICTED, now=later)
        ).delete_pods
        == ()
    )
    back = advance(held.status, world(held.status, (), admission=ADMITTED, now=later))
    assert back.launch is not None
    assert back.launch.in_place == ()
    (entry,) = back.status.rollback_history
    assert (entry.restarted_in_place, entry.replaced_pods) == (0, 2)


def test_a_job_that_fails_after_a_stop_in_place_lets_its_kept_pods_go() -> None:
    """Before: the stop kept both pods for the next attempt, Planning found no checkpoint the
    rollback may use and failed the job, and the supervisors stayed up for good, each
    holding its node (and, under Kueue, the quota the job gave back)."""
    pods = (supervised(0), supervised(1))
    reports = {
        p.name: report(0, ProcessState.EXITED, message=render_termination_message(trip(p.node)))
        for p in pods
    }
    status = running(checkpoints=(record(40, stable=False),))
    step = advance(status, world(status, pods, reports))
    assert step.status.plan is not None
    assert (step.status.plan.action, step.status.plan.in_place) == (Action.ROLLBACK, True)
    assert step.delete_pods == ()
    for _ in range(4):
        if step.status.phase is Phase.FAILED:
            break
        step = advance(step.status, world(step.status, pods, reports))
    assert step.status.phase is Phase.FAILED
    assert {c.type: c.reason for c in step.status.conditions}["Failed"] == Reason.NO_CHECKPOINT
    assert step.delete_pods == ("job-a0-0", "job-a0-1")
    # A later tick asks again for a pod whose deletion did not start, not for one going.
    going = (dataclasses.replace(pods[0], deleting=True), pods[1])
    later = advance(step.status, world(step.status, going, reports))
    assert later.delete_pods == ("job-a0-1",)
