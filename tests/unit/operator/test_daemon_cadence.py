"""How often a job's daemon ticks: soon after a watch event (the rest of a trip's ranks are
acted on within a tenth of a second), on a half-second clock while its phase waits on time,
and not at all while nothing changes and nothing is due (a finished job's daemon only once a
minute)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from types import SimpleNamespace
from typing import Any

import pytest
from operator_builders import spec

from stabletrain_operator import reconcile
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.handlers import jobs
from stabletrain_operator.handlers.wakeups import WakeEvent
from stabletrain_operator.reconcile import JobKey, JobMemory


class Stopper:
    """kopf.DaemonStopped as the loop uses it: falsy (never stopped here), and a wait."""

    def __bool__(self) -> bool:
        return False

    async def wait(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def run_daemon(
    monkeypatch: pytest.MonkeyPatch, *, idle_for: float, scenario: Any, seconds: float
) -> list[float]:
    """The daemon loop for `seconds` with a tick that records when it ran and sets the next
    tick `idle_for` seconds ahead (0: a phase on the clock); `scenario(index, wake)` runs
    beside it. The tick times, from the start."""
    began = time.monotonic()
    ticks: list[float] = []

    async def fake_tick(*_: Any, **__: Any) -> bool:
        memory: JobMemory = _[4]
        ticks.append(time.monotonic() - began)
        memory.next_tick_at = time.monotonic() + idle_for if idle_for else 0.0
        return True

    monkeypatch.setattr(jobs, "tick", fake_tick)
    index: dict[tuple[str, str, str], list[Any]] = {("ns", "job", "uid-1"): []}
    woken, stopper = WakeEvent(), Stopper()
    body = SimpleNamespace(metadata={"resourceVersion": "1", "uid": "uid-1"})
    daemon = asyncio.create_task(
        jobs._reconcile(
            JobKey("ns", "job"), body, worker_pods=index, kube=None,  # type: ignore[arg-type]
            memo={}, woken=woken, stopped=stopper,  # type: ignore[arg-type]
        )
    )  # fmt: skip
    await scenario(index, woken)
    await asyncio.sleep(seconds - (time.monotonic() - began))
    daemon.cancel()  # as kopf stops an async daemon
    with contextlib.suppress(asyncio.CancelledError):
        await daemon
    return ticks


def test_a_pod_event_right_after_a_tick_is_acted_on_within_the_event_gap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def second_rank_ends(index: dict[Any, list[Any]], woken: asyncio.Event) -> None:
        await asyncio.sleep(0.05)
        index[("ns", "job", "uid-1")].append("rank-1 Failed")
        woken.set()

    ticks = asyncio.run(
        run_daemon(monkeypatch, idle_for=60, scenario=second_rank_ends, seconds=0.6)
    )
    assert len(ticks) == 2, ticks
    assert ticks[1] - ticks[0] < jobs.TICK_SECONDS / 2


def test_a_phase_on_the_clock_ticks_every_half_second_and_an_idle_one_not_at_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def nothing(*_: Any) -> None:
        return None

    clocked = asyncio.run(run_daemon(monkeypatch, idle_for=0, scenario=nothing, seconds=1.2))
    assert len(clocked) == 3, clocked
    assert all(b - a >= jobs.TICK_SECONDS * 0.9 for a, b in itertools.pairwise(clocked))
    idle = asyncio.run(run_daemon(monkeypatch, idle_for=60, scenario=nothing, seconds=0.8))
    assert len(idle) == 1, idle


@pytest.mark.parametrize(
    ("phase", "suspend"),
    [(Phase.SUCCEEDED, False), (Phase.FAILED, False), (Phase.SUSPENDED, True)],
)
def test_a_finished_or_suspended_job_waits_for_a_change_not_the_clock(
    phase: Phase, suspend: bool
) -> None:
    before = time.monotonic()
    due = reconcile._next_tick_at(phase, spec(suspend=suspend), JobMemory(), None)
    assert due >= before + reconcile.IDLE_RECHECK_SECONDS


def test_phases_that_wait_on_time_stay_on_the_clock() -> None:
    for phase in (Phase.PENDING, Phase.STOPPING, Phase.PLANNING, Phase.RELAUNCHING):
        assert reconcile._next_tick_at(phase, spec(), JobMemory(), None) == 0.0
    # A suspend still waiting for its save, and a release retried after unschedulable pods.
    assert reconcile._next_tick_at(Phase.RUNNING, spec(suspend=True), JobMemory(), None) == 0.0
    assert reconcile._next_tick_at(Phase.SUSPENDED, spec(), JobMemory(), None) == 0.0
