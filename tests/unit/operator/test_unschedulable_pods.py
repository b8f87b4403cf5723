"""Pods the scheduler cannot place: the scheduler's own words in the job's condition and
Event past the bound; Wait keeps the pods, Release stops the attempt and tries again."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from operator_builders import T0, pod, spec
from test_machine import conditions, running, world

from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.machine import Transition, advance
from stabletrain_operator.observe.pod_facts import PodState, pod_facts

SAYS = "0/2 nodes are available: node-a: nodeSelector pool=h100 does not match"


def waiting_pods() -> tuple[object, ...]:
    placed = dataclasses.replace(pod(0), created_at=T0)
    pending = dataclasses.replace(
        pod(1, state=PodState.PENDING), node=None, ip=None, unschedulable=SAYS, created_at=T0
    )
    return placed, pending


def test_pod_facts_read_the_schedulers_message_from_podscheduled() -> None:
    body = {
        "metadata": {"name": "job-a0-1", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"stabletrain.dev/attempt": "0", "stabletrain.dev/rank": "1"}},
        "spec": {},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": SAYS}]},
    }  # fmt: skip
    facts = pod_facts(body)
    assert facts is not None
    assert facts.unschedulable == SAYS
    assert facts.created_at == T0


def test_wait_says_which_pods_and_why_after_the_bound_and_clears_when_placed() -> None:
    job = spec(scheduling={"unschedulableSeconds": 30})
    status = running()
    early = advance_at(status, job, T0 + timedelta(seconds=29))
    assert "Unschedulable" not in conditions(early)
    stuck = advance_at(status, job, T0 + timedelta(seconds=31))
    assert conditions(stuck)["Unschedulable"] == ("True", "Unschedulable")
    assert stuck.status.unschedulable_pods == 1
    assert stuck.status.phase is Phase.RUNNING, "Wait keeps every pod"
    assert not stuck.delete_pods
    (event,) = [e for e in stuck.events if e.reason == "Unschedulable"]
    assert event.type == "Warning"
    assert "job-a0-1" in event.message
    assert SAYS in event.message
    again = advance_at(stuck.status, job, T0 + timedelta(seconds=40))
    assert not [e for e in again.events if e.reason == "Unschedulable"], "one Event"
    placed = tuple(dataclasses.replace(pod(rank), created_at=T0) for rank in (0, 1))
    cleared = advance(stuck.status, world(stuck.status, spec=job, pods=placed,
                                          now=T0 + timedelta(seconds=50)))  # fmt: skip
    assert conditions(cleared)["Unschedulable"] == ("False", "Scheduled")
    assert cleared.status.unschedulable_pods is None


def advance_at(
    status: StableTrainingJobStatus, job: StableTrainingJobSpec, now: datetime
) -> Transition:
    return advance(status, world(status, spec=job, pods=waiting_pods(), now=now))


def test_release_stops_the_attempt_and_tries_again_after_the_bound() -> None:
    job = spec(scheduling={"unschedulableSeconds": 30, "whenUnschedulable": "Release"})
    status = running()
    released = advance_at(status, job, T0 + timedelta(seconds=31))
    assert released.status.phase is Phase.STOPPING
    assert released.delete_pods == ("job-a0-0", "job-a0-1")
    assert conditions(released)["Suspended"] == ("True", "Unschedulable")
    stopped_at = T0 + timedelta(seconds=32)
    suspended = advance(released.status, world(released.status, spec=job, now=stopped_at))
    assert suspended.status.phase is Phase.SUSPENDED
    too_soon = advance(suspended.status, world(suspended.status, spec=job,
                                               now=T0 + timedelta(seconds=50)))  # fmt: skip
    assert too_soon.status.phase is Phase.SUSPENDED
    retry = advance(suspended.status, world(suspended.status, spec=job,
                                            now=T0 + timedelta(seconds=62)))  # fmt: skip
    assert retry.status.phase is Phase.PLANNING
    assert retry.status.counters.restarts == 0
