"""A stop the pod watch decided waits for the copies the surviving pods still send to the PFS.

A rank killed outright breaks the others' collective: their agents finish the copies in
flight and answer until scraped (stabletrain_agent.guard, hand-over). One scrape at the
decision came before those copies landed, and the restart found no checkpoint verified on
the PFS (tests/e2e/test_hangs.py, killed rank, NoUsableCheckpoint).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from operator_builders import T0, pod, spec

from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.checkpoint.inventory import CheckpointRecord, NodeCopy, TierCopy
from stabletrain_contract.directives import Directives
from stabletrain_contract.names import Action
from stabletrain_operator import reconcile
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.jobview import JobView
from stabletrain_operator.machine import World, advance
from stabletrain_operator.observe.pod_facts import PodState
from stabletrain_operator.observe.scrape import ScrapeError, ScrapeResult, ScrapeTarget
from stabletrain_operator.policy import PolicyLedger
from stabletrain_operator.reconcile import JobKey, JobMemory, status_json, tick

KEY = JobKey("ns", "job")


def copy(step: int, *, on_pfs: bool) -> CheckpointRecord:
    """Step `step` as node-a's agent lists it: its local copy, the PFS as its scan saw it."""
    return CheckpointRecord(
        step=step,
        attempt=0,
        stable=True,
        saved_at=T0,
        pfs=TierCopy(complete=on_pfs, verified=on_pfs),
        local=(NodeCopy(node="node-a", complete=True, verified=True),),
    )


def answer(*records: CheckpointRecord, replicating: tuple[int, ...] | None = None) -> ScrapeResult:
    status = AgentStatus(
        replicating=replicating,
        attempt=0,
        node="node-a",
        node_rank=0,
        updated_at=T0,
        step=11,
        lr_scale=1.0,
        applied_generation=1,
        inventory=records,
        pfs_available=True,
    )
    return ScrapeResult(pod="job-a0-0", status=status)


GONE = ScrapeResult("job-a0-0", None, ScrapeError.UNREACHABLE, "connection refused")


class Agents:
    """The operator's shared scraper: each round the next scripted answer, the last one from
    then on."""

    def __init__(self, rounds: Sequence[ScrapeResult]) -> None:
        self.rounds = list(rounds)
        self.asked = 0

    async def scrape_all(
        self, targets: Sequence[ScrapeTarget], timeout: float
    ) -> list[ScrapeResult]:
        assert [t.pod for t in targets] == ["job-a0-0"], "only the pod still running"
        self.asked += 1
        return [self.rounds.pop(0) if len(self.rounds) > 1 else self.rounds[0]]


class Cluster:
    """The API calls a tick makes once the job's base objects exist."""

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    def write_status(self, namespace: str, name: str, version: str, status: Any) -> Any:
        self.written.append(status)
        return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "2"}}

    def delete_pod(self, namespace: str, name: str, *, force: bool) -> None:
        self.deleted.append(name)

    def event(self, job: Any, kind: str, reason: str, message: str) -> None:
        pass


def killed_rank_tick(agents: Agents, *, round_due: bool = False) -> tuple[Cluster, JobMemory]:
    """Rank 1 was SIGKILLed at step 12 (the pod watch says so); rank 0 still runs. The last
    scrape, a second ago, saw step 5 only locally: its PFS copy was on its way. Unless
    `round_due`, the tick has no scrape round of its own."""
    status = StableTrainingJobStatus(
        phase=Phase.RUNNING,
        attempt=0,
        directives_generation=1,
        step=11,
        checkpoints=(copy(5, on_pfs=False),),
    )
    job = {
        "metadata": {"name": "job", "namespace": "ns", "uid": "u", "resourceVersion": "1"},
        "spec": spec().model_dump(mode="json", by_alias=True),
        "status": status_json(status),
    }
    memory = JobMemory(base_ready=True, directives={0: Directives(generation=1, attempt=0)})
    memory.view = JobView("1", job, spec(), status, obtained_at=0.0)
    memory.last_scrape = 0.0 if round_due else 1e12
    killed = dataclasses.replace(
        pod(1, state=PodState.FAILED), exit_code=137, message="exitcode  : -9"
    )
    cluster = Cluster()
    alive = asyncio.run(
        tick(cluster, KEY, job, [pod(0), killed], memory, scraper=agents)  # type: ignore[arg-type]
    )
    assert alive
    return cluster, memory


def planned_step(status: StableTrainingJobStatus) -> int | None:
    """The step the restart resumes from, once its pods are gone and its backoff is over."""
    world = World(
        now=T0,
        job="job",
        spec=spec(),
        generation=1,
        pods=(),
        ledger=PolicyLedger.from_job_status(status),
        previous_nodes=("node-a", "node-b"),
    )
    planning = advance(status, world).status
    assert planning.phase is Phase.PLANNING
    assert planning.plan is not None
    later = dataclasses.replace(world, now=planning.plan.started_at + timedelta(seconds=60))
    relaunching = advance(planning, later).status
    assert relaunching.phase is Phase.RELAUNCHING, relaunching.conditions
    assert relaunching.plan is not None
    return relaunching.plan.target_step


@pytest.fixture(autouse=True)
def quick_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconcile, "SETTLE_PAUSE_SECONDS", 0.01)


def test_a_restart_after_a_killed_rank_plans_from_copies_that_landed_since() -> None:
    """Before: one scrape at the decision, still in flight, and the restart failed with
    NoUsableCheckpoint (rejected step 5, not verified on the PFS)."""
    agents = Agents(
        [
            answer(copy(5, on_pfs=False), copy(10, on_pfs=False)),  # the survivor flushes
            answer(copy(5, on_pfs=True), copy(10, on_pfs=True)),  # both landed
        ]
    )
    cluster, memory = killed_rank_tick(agents)
    assert agents.asked == 2
    assert memory.view is not None
    stopping = memory.view.status
    assert stopping.phase is Phase.STOPPING
    assert stopping.plan is not None
    assert stopping.plan.action is Action.RESTART_FROM_LATEST
    assert [(r.step, r.pfs.verified) for r in stopping.checkpoints] == [(5, True), (10, True)]
    assert len(cluster.written) == 1, "the decision is written once, with what was scraped"
    assert sorted(cluster.deleted) == ["job-a0-0", "job-a0-1"]
    assert planned_step(stopping) == 10


def test_a_round_due_at_the_decision_is_not_the_last_while_it_shows_a_copy_in_flight() -> None:
    agents = Agents(
        [
            answer(copy(5, on_pfs=True), copy(10, on_pfs=False)),  # the tick's own round
            answer(copy(5, on_pfs=True), copy(10, on_pfs=True)),
        ]
    )
    _, memory = killed_rank_tick(agents, round_due=True)
    assert agents.asked == 2
    assert memory.view is not None
    stopping = memory.view.status
    assert [(r.step, r.pfs.verified) for r in stopping.checkpoints] == [(5, True), (10, True)]
    assert planned_step(stopping) == 10


def test_an_agent_that_ends_after_its_answer_is_planned_from_at_once() -> None:
    """Step 10 waits for the killed node's part, which never comes: the survivor's agent
    answers once more, then ends; its last answer is planned from, at once."""
    agents = Agents(
        [
            answer(copy(5, on_pfs=False)),
            answer(copy(5, on_pfs=True), copy(10, on_pfs=False)),
            GONE,
        ]
    )
    _, memory = killed_rank_tick(agents)
    assert agents.asked == 3
    assert memory.view is not None
    stopping = memory.view.status
    assert [(r.step, r.pfs.verified) for r in stopping.checkpoints] == [(5, True), (10, False)]
    assert planned_step(stopping) == 5


def test_copies_that_never_land_hold_the_stop_no_longer_than_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reconcile, "SETTLE_SECONDS", 0.2)
    agents = Agents([answer(copy(5, on_pfs=True), copy(10, on_pfs=False))])
    _, memory = killed_rank_tick(agents)
    assert 2 <= agents.asked <= 21
    assert memory.view is not None
    assert memory.view.status.phase is Phase.STOPPING


def test_a_copy_no_pod_still_sends_holds_the_stop_for_no_round() -> None:
    """Seen in `make chaos`: a hang stopped 9.65 s late, the settle waiting its whole bound
    for a local copy that could never complete on the PFS (the other node had given up its
    part while the PFS was read-only).  An agent that says what it still sends is waited
    for only while it sends something."""
    done = Agents([answer(copy(5, on_pfs=True), copy(10, on_pfs=False), replicating=())])
    killed_rank_tick(done)
    assert done.asked == 1
    sending = Agents(
        [
            answer(copy(5, on_pfs=True), copy(10, on_pfs=False), replicating=(10,)),
            answer(copy(5, on_pfs=True), copy(10, on_pfs=True), replicating=()),
        ]
    )
    _, memory = killed_rank_tick(sending)
    assert sending.asked == 2
    assert memory.view is not None
    assert planned_step(memory.view.status) == 10
