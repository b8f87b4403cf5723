"""The heartbeats the stall rule and the attribution judge belong to one attempt.

A pod restarted in place keeps its name across attempts: its last heartbeat of the attempt
that stopped must not count as the next attempt's, where an agent still starting up and not
answering yet would show as silent with it, and a silent agent is blamed for its peers'
failure (observe/culprit.py).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from operator_builders import T0, pod

from stabletrain_contract.channel import AgentStatus, Heartbeat, ThreadPlace
from stabletrain_operator import reconcile
from stabletrain_operator.observe.scrape import ScrapeError, ScrapeResult
from stabletrain_operator.reconcile import JobMemory


def answer(attempt: int) -> ScrapeResult:
    beat = Heartbeat(
        rank=0, started_at=T0 - timedelta(minutes=1), steps_completed=9, last_step=9,
        last_step_at=T0, slowest_step_seconds=0.1, in_step=True, place=ThreadPlace.TORCH,
    )  # fmt: skip
    status = AgentStatus(
        attempt=attempt, node="node-a", node_rank=0, updated_at=T0, step=9, lr_scale=1.0,
        applied_generation=1, heartbeat=beat,
    )  # fmt: skip
    return ScrapeResult(pod="job-a0-0", status=status)


SILENT = ScrapeResult("job-a0-0", None, ScrapeError.UNREACHABLE, "connection refused")


def test_a_pod_restarted_in_place_starts_the_next_attempt_without_a_heartbeat() -> None:
    memory = JobMemory()
    (seen,) = reconcile._progress(memory, [pod(0)], (answer(0),), 0)
    assert not seen.silent
    (quiet,) = reconcile._progress(memory, [pod(0)], (SILENT,), 0)
    assert quiet.silent, "the same attempt: the agent that answered went silent"
    relabelled = [dataclasses.replace(pod(0), attempt=1)]  # the same pod, kept in place
    assert reconcile._progress(memory, relabelled, (SILENT,), 1) == ()
    assert reconcile._progress(memory, relabelled, (answer(0),), 1) == (), "the old process"
    (fresh,) = reconcile._progress(memory, relabelled, (answer(1),), 1)
    assert not fresh.silent
