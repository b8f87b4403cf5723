"""The heartbeat answers while the training thread is blocked, and says where it is blocked."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.endpoint.exporter import AgentExporter
from stabletrain_agent.endpoint.heartbeat import HeartbeatClock
from stabletrain_contract.channel import ThreadPlace
from stabletrain_contract.detection import DetectionConfig
from stabletrain_contract.directives import DEFAULT_TRIP_ON, Directives
from stabletrain_contract.signals.monitor import SignalMonitor, StepObservation
from support.agent_client import fetch_status

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def stamp(self) -> float:
        return self.now.timestamp()


def _blocking_in(module: str, release: threading.Event) -> Callable[[], None]:
    """A function whose frame belongs to `module` and that blocks until `release` is set."""
    namespace: dict[str, object] = {"__name__": module, "release": release}
    exec("def wait_here():\n    release.wait(30)\n", namespace)
    function = namespace["wait_here"]
    assert callable(function)
    return function  # type: ignore[no-any-return]


@contextmanager
def _training_thread(
    clock: HeartbeatClock,
    steps: list[tuple[int, float]],
    fake: FakeClock,
    block: Callable[[], None],
) -> Iterator[threading.Thread]:
    """A thread that completes `steps` (step, seconds after the previous one), then blocks."""
    done = threading.Event()

    def train() -> None:
        for step, seconds in steps:
            fake.now += timedelta(seconds=seconds)
            clock.completed(step)
        done.set()
        block()

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    assert done.wait(5)
    try:
        yield thread
    finally:
        thread.join(5)


def test_a_rank_blocked_in_its_own_code_reports_its_last_step_and_where_it_waits() -> None:
    fake = FakeClock()
    clock = HeartbeatClock(rank=1, clock=fake, stamp=fake.stamp)
    release = threading.Event()
    steps = [(41, 0.5), (42, 2.0), (43, 0.5)]
    with _training_thread(clock, steps, fake, _blocking_in("faults", release)):
        beat = clock.read()
        release.set()
    assert (beat.rank, beat.steps_completed, beat.last_step) == (1, 3, 43)
    assert beat.last_step_at == T0 + timedelta(seconds=3)
    assert beat.slowest_step_seconds == 2.0, "gaps between completed steps, the first excluded"
    assert beat.in_step
    assert beat.place is ThreadPlace.ELSEWHERE
    assert "wait_here" in beat.frame, beat.frame


def test_a_rank_waiting_inside_torch_and_one_saving_a_checkpoint_are_told_apart() -> None:
    for module, place in (
        ("torch.distributed.distributed_c10d", ThreadPlace.TORCH),
        ("torch.autograd", ThreadPlace.TORCH),
        ("stabletrain_agent.checkpoint.manager", ThreadPlace.CHECKPOINT),
    ):
        fake = FakeClock()
        clock = HeartbeatClock(rank=0, clock=fake, stamp=fake.stamp)
        release = threading.Event()
        with _training_thread(clock, [(7, 1.0)], fake, _blocking_in(module, release)):
            beat = clock.read()
            release.set()
        assert beat.place is place, module


def test_before_the_first_step_and_after_the_thread_ended() -> None:
    fake = FakeClock()
    clock = HeartbeatClock(rank=0, clock=fake, stamp=fake.stamp)
    starting = clock.read()
    assert (starting.steps_completed, starting.last_step, starting.in_step) == (0, None, False)
    assert starting.started_at == T0
    with _training_thread(clock, [(1, 1.0)], fake, lambda: None) as thread:
        thread.join(5)
        ended = clock.read()
    assert ended.place is ThreadPlace.GONE
    assert not ended.in_step


def test_training_since_is_the_agents_start_until_the_restore_reports_its_end() -> None:
    """The operator's start-up stall bound counts from here: never through a restore."""
    fake = FakeClock()
    clock = HeartbeatClock(rank=0, clock=fake, stamp=fake.stamp)
    assert clock.read().training_since == T0, "nothing restored: training began at the start"
    clock.began_training(T0 + timedelta(seconds=42))
    assert clock.read().training_since == T0 + timedelta(seconds=42)
    clock.began_training(T0 - timedelta(seconds=5))
    assert clock.read().training_since == T0, "never before this process's own start"


def test_the_status_endpoint_answers_while_the_training_thread_is_blocked() -> None:
    source = DirectiveSource(
        attempt=0, initial=Directives.model_validate({"generation": 1, "attempt": 0})
    )
    release = threading.Event()
    ready = threading.Event()
    holder: list[AgentExporter] = []

    def train() -> None:
        exporter = AgentExporter(source=source, token="t", node="node-b", node_rank=1, rank=1)
        exporter.start()
        holder.append(exporter)
        monitor = SignalMonitor(DetectionConfig(), DEFAULT_TRIP_ON)
        for step in (1, 2):
            monitor.observe(
                StepObservation(
                    step=step,
                    loss=2.0,
                    grad_norm=0.5,
                    lr=1e-3,
                    tokens_per_second=None,
                    custom={},
                    checkpoint_in_flight=False,
                    steps_since_start=step,
                )
            )
            exporter.update(monitor.snapshot(), lr_scale=1.0, applied_generation=1)
        ready.set()
        _blocking_in("faults", release)()

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        status = fetch_status(holder[0].url, timeout=2.0)
    finally:
        release.set()
        thread.join(5)
        for exporter in holder:
            exporter.stop()
    beat = status.heartbeat
    assert beat is not None
    assert (beat.rank, beat.last_step, beat.steps_completed) == (1, 2, 2)
    assert beat.place is ThreadPlace.ELSEWHERE
    assert status.updated_at >= beat.last_step_at  # type: ignore[operator]
