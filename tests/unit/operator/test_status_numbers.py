"""The numbers `kubectl get stj` shows: the loss to 4 significant digits, and a finished
run's final step and loss rather than those of its last scrape."""

from __future__ import annotations

import math

import pytest
from operator_builders import NODES, T0, agent, pod, spec

from stabletrain_contract.completion import Completion
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.status import StableTrainingJobStatus, rounded_loss
from stabletrain_operator.machine import World, advance
from stabletrain_operator.observe.pod_facts import PodState
from stabletrain_operator.policy import PolicyLedger
from stabletrain_operator.reconcile import status_json


def world(status: StableTrainingJobStatus, **changes: object) -> World:
    base: dict[str, object] = {
        "now": T0,
        "job": "job",
        "spec": spec(),
        "generation": 1,
        "pods": tuple(pod(rank) for rank in range(len(NODES))),
        "ledger": PolicyLedger.from_job_status(status),
        "previous_nodes": NODES,
    }
    base.update(changes)
    return World(**base)  # type: ignore[arg-type]


def running(step: int = 290) -> StableTrainingJobStatus:
    return StableTrainingJobStatus(
        phase=Phase.RUNNING, directives_generation=1, step=step, loss=2.61
    )


@pytest.mark.parametrize(
    ("loss", "kept"),
    [
        (2.538881301879883, 2.539),
        (0.000123456789, 0.0001235),
        (12345.678, 12350.0),
        (2.5, 2.5),
        (None, None),
        (math.nan, None),
        (math.inf, None),
    ],
)
def test_status_keeps_four_significant_digits_of_the_loss(
    loss: float | None, kept: float | None
) -> None:
    assert rounded_loss(loss) == kept


def test_a_scraped_loss_is_written_rounded() -> None:
    status = running()
    scrapes = (agent(0, step=291, loss=2.538881301879883), agent(1, step=291))
    after = advance(status, world(status, scrapes=scrapes)).status
    assert (after.step, after.loss) == (291, 2.539)
    assert status_json(after)["loss"] == 2.539


def test_a_finished_run_shows_the_final_step_and_loss_its_pods_stated() -> None:
    """Before: the last scrape's step (290) and loss stayed as the finished job's."""
    status = running(step=290)
    final = Completion(step=300, attempt=0, loss=2.412345678)
    finished = tuple(
        pod(rank, state=PodState.SUCCEEDED, completion=final) for rank in range(len(NODES))
    )
    done = advance(status, world(status, pods=finished)).status
    assert done.phase is Phase.SUCCEEDED
    assert (done.step, done.loss) == (300, 2.412)


def test_the_lowest_rank_states_the_loss_and_an_older_attempt_states_nothing() -> None:
    status = running(step=290).model_copy(update={"attempt": 1})
    finished = (
        pod(0, attempt=1, state=PodState.SUCCEEDED, completion=Completion(300, 1, 2.4)),
        pod(1, attempt=1, state=PodState.SUCCEEDED, completion=Completion(300, 1, 2.5)),
    )
    assert advance(status, world(status, pods=finished)).status.loss == 2.4
    stale = tuple(
        pod(rank, attempt=1, state=PodState.SUCCEEDED, completion=Completion(280, 0, 2.4))
        for rank in range(len(NODES))
    )
    done = advance(status, world(status, pods=stale)).status
    assert (done.phase, done.step, done.loss) == (Phase.SUCCEEDED, 290, 2.61)


def test_pods_that_stated_nothing_leave_the_last_scrape_standing() -> None:
    status = running(step=290)
    finished = tuple(pod(rank, state=PodState.SUCCEEDED) for rank in range(len(NODES)))
    done = advance(status, world(status, pods=finished)).status
    assert (done.phase, done.step, done.loss) == (Phase.SUCCEEDED, 290, 2.61)
