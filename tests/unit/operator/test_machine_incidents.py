"""Incidents through the state machine: a stall pinned on a rank and its node, the relaunch
that avoids the node, the suspect list expiring, and a crash loop that ends the retries."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from operator_builders import NODES, T0, pod, record, spec

from stabletrain_contract.channel import Heartbeat, ThreadPlace
from stabletrain_contract.names import Action
from stabletrain_operator.api.constants import ConditionType, Phase, Reason
from stabletrain_operator.api.status import StableTrainingJobStatus, SuspectNode
from stabletrain_operator.machine import World, advance
from stabletrain_operator.observe.culprit import PEERS_AWAITED
from stabletrain_operator.observe.pod_facts import PodFacts, PodState
from stabletrain_operator.observe.stall import RankProgress
from stabletrain_operator.policy import PolicyLedger

STALL = 10
IMPORT_ERROR = (
    'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n'
    "ModuleNotFoundError: No module named 'helpers'"
)


def job_spec(**recovery: object) -> object:
    return spec(
        detection={"stallSeconds": STALL},
        recovery={"budgets": {"maxRestarts": 5, "cooldownSeconds": 0}, **recovery},
    )


def world(status: StableTrainingJobStatus, **changes: object) -> World:
    base: dict[str, object] = {
        "now": T0,
        "job": "job",
        "spec": job_spec(),
        "generation": 1,
        "pods": (pod(0), pod(1)),
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
        "step": 40,
        "checkpoints": (record(25),),
        "attempt_progressed": True,
    }
    data.update(changes)
    return StableTrainingJobStatus(**data)  # type: ignore[arg-type]


def beat(rank: int, *, idle: float, place: ThreadPlace) -> RankProgress:
    heartbeat = Heartbeat(
        rank=rank,
        started_at=T0 - timedelta(minutes=5),
        steps_completed=40,
        last_step=40,
        last_step_at=T0 - timedelta(seconds=idle),
        slowest_step_seconds=0.4,
        in_step=True,
        place=place,
        frame="examples/tiny-gpt/faults.py:52 before_step"
        if place is ThreadPlace.ELSEWHERE
        else "",
    )
    return RankProgress(f"job-a0-{rank}", NODES[rank], heartbeat, T0, T0)


def test_a_stall_restarts_and_the_relaunch_keeps_away_from_the_node_that_stopped_first() -> None:
    status = running()
    progress = (beat(0, idle=STALL + 1, place=ThreadPlace.TORCH),
                beat(1, idle=STALL + 1, place=ThreadPlace.ELSEWHERE))  # fmt: skip
    quiet = advance(status, world(status, progress=(beat(0, idle=3, place=ThreadPlace.TORCH),)))
    assert quiet.status.phase is Phase.RUNNING
    stopping = advance(status, world(status, progress=progress))
    assert stopping.status.phase is Phase.STOPPING
    plan = stopping.status.plan
    assert plan is not None
    assert (plan.action, plan.signal, plan.rule) == (Action.RESTART_FROM_LATEST, "Stalled",
                                                     "infrastructure")  # fmt: skip
    assert [(s.rank, s.node, s.avoid) for s in plan.suspects] == [(1, "node-b", True)]
    assert "faults.py:52" in plan.suspects[0].reason
    (suspect,) = stopping.status.suspect_nodes
    assert (suspect.node, suspect.incidents) == ("node-b", 1)
    assert suspect.expires_at == T0 + timedelta(seconds=3600)
    reasons = [e.reason for e in stopping.events]
    assert Reason.SUSPECT_NODE in reasons
    assert set(stopping.delete_pods) == {"job-a0-0", "job-a0-1"}

    planning = advance(stopping.status, world(stopping.status, pods=()))
    later = T0 + timedelta(seconds=5)
    relaunching = advance(planning.status, world(planning.status, pods=(), now=later))
    assert relaunching.status.phase is Phase.RELAUNCHING
    relaunched = advance(relaunching.status, world(relaunching.status, pods=(), now=later))
    launch = relaunched.launch
    assert launch is not None
    assert launch.avoid_nodes == ("node-b",)
    assert launch.avoid_required
    assert launch.preferred_nodes == ("node-a", None), "no preference for the suspect node"
    entry = relaunched.status.rollback_history[-1]
    assert [(s.rank, s.node) for s in entry.suspects] == [(1, "node-b")]
    assert not relaunched.status.attempt_progressed


def test_a_second_incident_on_the_node_counts_and_the_list_expires() -> None:
    known = SuspectNode(
        node="node-b",
        incidents=1,
        last_reason="stalled",
        last_incident_at=T0 - timedelta(minutes=10),
        expires_at=T0 + timedelta(minutes=50),
    )
    status = running(suspect_nodes=(known,))
    progress = (beat(0, idle=STALL + 1, place=ThreadPlace.TORCH),
                beat(1, idle=STALL + 1, place=ThreadPlace.ELSEWHERE))  # fmt: skip
    again = advance(status, world(status, progress=progress))
    assert [(n.node, n.incidents) for n in again.status.suspect_nodes] == [("node-b", 2)]
    expired = advance(status, world(status, now=T0 + timedelta(hours=1)))
    assert expired.status.suspect_nodes == ()


def test_placement_ignore_records_suspects_but_launches_anywhere() -> None:
    ignoring = job_spec(placement={"suspects": "Ignore"})
    known = SuspectNode(node="node-b", incidents=3, last_reason="killed",
                        last_incident_at=T0, expires_at=T0 + timedelta(hours=1))  # fmt: skip
    status = advance(
        running(suspect_nodes=(known,)),
        world(running(), spec=ignoring, pods=(pod(0), pod(1, state=PodState.FAILED))),
    ).status
    for _ in range(3):
        step = advance(status, world(status, spec=ignoring, pods=(), now=T0 + timedelta(seconds=9)))
        status = step.status
    assert step.launch is not None
    assert step.launch.avoid_nodes == ()


def _failed(rank: int, message: str, attempt: int = 0) -> PodFacts:
    return PodFacts(
        name=f"job-a{attempt}-{rank}", attempt=attempt, rank=rank, state=PodState.FAILED,
        node=NODES[rank], ip=None, deleting=False, exit_code=1, reason="Error",
        message=message, finished_at=T0,
    )  # fmt: skip


def test_a_failure_beside_a_silent_running_peer_stops_at_once_and_blames_the_peer() -> None:
    """Rank 1's node is lost: its pod still shows Running, its agent no longer answers;
    rank 0 failed on the broken collective.  The decision does not wait PEERS_AWAITED, and
    the relaunch avoids rank 1's node, not rank 0's."""
    status = running()
    pods = (_failed(0, "RuntimeError: Connection reset by peer"), pod(1))
    lost = beat(1, idle=1, place=ThreadPlace.TORCH)
    answering = advance(status, world(status, pods=pods, progress=(lost,)))
    assert answering.status.plan is None, "rank 1's agent answers: its end may name the culprit"
    silent = dataclasses.replace(lost, silent=True)
    stopping = advance(status, world(status, pods=pods, progress=(silent,)))
    plan = stopping.status.plan
    assert plan is not None
    assert plan.action is Action.RESTART_FROM_LATEST
    (suspect,) = stopping.status.suspect_nodes
    assert suspect.node == NODES[1]
    assert "its agent stopped answering" in suspect.last_reason


def test_every_rank_failing_before_its_first_step_ends_the_job_with_the_error_named() -> None:
    status = running(attempt_progressed=False)
    pods = (_failed(0, IMPORT_ERROR), _failed(1, IMPORT_ERROR))
    stopping = advance(status, world(status, pods=pods))
    plan = stopping.status.plan
    assert plan is not None
    assert plan.action is Action.FAIL
    failure = stopping.status.last_failure
    assert failure is not None
    assert failure.signature == "ModuleNotFoundError: No module named 'helpers'"
    assert failure.before_first_step
    (event,) = [e for e in stopping.events if e.reason == Reason.CRASH_LOOP]
    assert "No module named 'helpers'" in event.message
    assert "the job's" in event.message
    failed = advance(stopping.status, world(stopping.status, pods=()))
    assert failed.status.phase is Phase.FAILED
    condition = {c.type: c for c in failed.status.conditions}[ConditionType.FAILED]
    assert condition.reason == Reason.CRASH_LOOP
    assert "No module named 'helpers'" in condition.message


def test_one_failure_after_progress_is_a_plain_restart_and_a_repeat_is_a_loop() -> None:
    status = running()
    pods = (pod(0), _failed(1, IMPORT_ERROR))
    held = advance(status, world(status, pods=pods))
    assert held.status.plan is None, "rank 0 still runs: its end may name the culprit"
    first = advance(status, world(status, pods=pods, now=T0 + PEERS_AWAITED))
    assert first.status.plan is not None
    assert first.status.plan.action is Action.RESTART_FROM_LATEST
    backoff = job_spec(crashLoop={"action": "Backoff", "backoffSeconds": 900})
    second = running(attempt=1, last_failure=first.status.last_failure)
    repeated = advance(
        second,
        world(
            second,
            spec=backoff,
            pods=(pod(0, attempt=1), _failed(1, IMPORT_ERROR, 1)),
            now=T0 + PEERS_AWAITED,
        ),
    )
    plan = repeated.status.plan
    assert plan is not None
    assert (plan.action, plan.backoff_seconds) == (Action.RESTART_FROM_LATEST, 900)
    assert "the same error ended attempts 0 and 1" in repeated.events[0].message
    waiting = advance(
        repeated.status.model_copy(update={"phase": Phase.PLANNING}),
        world(repeated.status, spec=backoff, pods=(), now=T0 + timedelta(seconds=600)),
    )
    assert waiting.status.phase is Phase.PLANNING, "Backoff holds the relaunch 900 s"
