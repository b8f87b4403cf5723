"""The guard keeps the exporter's checkpoint inventory current between trips: a crash
without a trip report leaves the operator only its last scrape to plan from."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.endpoint.exporter import AgentExporter
from stabletrain_agent.guard import HAND_OVER_SECONDS, Guard, GuardEnv
from stabletrain_contract.channel import AgentStatus, status_credential
from stabletrain_contract.checkpoint.inventory import CheckpointRecord
from stabletrain_contract.directives import Directives
from support.agent_client import AgentUnreachableError, fetch_status


class CountingManager(CheckpointManager):
    """The real manager, counting inventory scans (the guard must scan only on change)."""

    scans = 0

    def inventory(self) -> list[CheckpointRecord]:
        self.scans += 1
        return super().inventory()


TOKEN = "t"
OPERATOR = status_credential(TOKEN)
"""What the operator's scrapes present: only their reads count as the hand-over."""


@pytest.fixture
def exporter() -> Iterator[AgentExporter]:
    source = DirectiveSource(0, Directives(generation=1, attempt=0))
    exporter = AgentExporter(source=source, token=TOKEN, node="node-a", node_rank=0)
    exporter.start()
    try:
        yield exporter
    finally:
        exporter.stop()


def wait_for_status(
    exporter: AgentExporter, train_step: Callable[[], None], ready: Callable[[AgentStatus], bool]
) -> AgentStatus:
    """Train (the guard exports from its step) until the scraped status satisfies `ready`."""
    deadline = time.monotonic() + 30
    while True:
        train_step()
        status = fetch_status(exporter.url, credential=OPERATOR)
        if ready(status):
            return status
        assert time.monotonic() < deadline, f"status never got there: {status}"
        time.sleep(0.02)


def settled(count: Callable[[], int], quiet: float = 0.5, timeout: float = 30.0) -> int:
    """`count()` once it stayed the same for `quiet` seconds: a fixed sleep let a scan that
    started late under load land inside the window that must have none."""
    deadline = time.monotonic() + timeout
    value, since = count(), time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, f"still changing after {timeout} s: {value}"
        time.sleep(0.05)
        if count() != value:
            value, since = count(), time.monotonic()
    return value


def guarded_run(
    tmp_path: Path, exporter: AgentExporter, replication_retry_s: float = 5.0
) -> tuple[Guard, CountingManager, Callable[[], None]]:
    """A guard exporting to `exporter`, its started manager, and one training step."""
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    source = DirectiveSource(0, Directives(generation=1, attempt=0))
    guard = Guard(
        model, optimizer, directives=source, exporter=exporter, guard_env=GuardEnv(node="node-a")
    )
    config = CheckpointConfig(
        tmp_path / "local", tmp_path / "pfs", 0, "node-a", replication_retry_s=replication_retry_s
    )
    manager = CountingManager(config, {"train": guard})
    guard.checkpoints = manager
    (tmp_path / "pfs").mkdir()
    assert manager.restore() is None

    def train_step() -> None:
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()

    return guard, manager, train_step


def test_a_committed_save_is_scraped_without_any_trip(
    tmp_path: Path, exporter: AgentExporter
) -> None:
    guard, manager, train_step = guarded_run(tmp_path, exporter)
    try:
        started = wait_for_status(exporter, train_step, lambda s: s.pfs_available is True)
        assert started.inventory == ()
        saved_at = guard.global_step
        manager.save(saved_at, stable=True)
        manager.wait()

        def listed_everywhere(status: AgentStatus) -> bool:
            record = next((r for r in status.inventory if r.step == saved_at), None)
            return record is not None and record.pfs.verified and bool(record.local_copy("node-a"))

        status = wait_for_status(exporter, train_step, listed_everywhere)
        assert status.latest_trip is None
        assert [(r.step, r.stable) for r in status.inventory] == [(saved_at, True)]
        assert status.pfs_available is True
        assert status.pfs_message == ""
        assert status.replicating == (), "nothing left to send: a stop need not wait"

        scans = settled(lambda: manager.scans)  # any export still running finishes
        for _ in range(20):
            train_step()
        time.sleep(0.2)
        assert manager.scans == scans  # nothing changed: no scan

        (tmp_path / "pfs").rename(tmp_path / "pfs-gone")  # the PFS goes away
        second = guard.global_step
        manager.save(second, stable=True)
        manager.wait()
        down = wait_for_status(exporter, train_step, lambda s: s.pfs_available is False)
        assert "not there" in down.pfs_message
        assert down.replicating == (second,)
        assert [(r.step, r.pfs.complete, bool(r.local)) for r in down.inventory] == [
            (saved_at, False, True),
            (second, False, True),
        ]
    finally:
        manager.close()
        guard.close()


def test_a_copy_landing_while_the_training_thread_is_blocked_is_still_exported(
    tmp_path: Path, exporter: AgentExporter
) -> None:
    """A peer died: this rank's training thread waits in a collective and steps no more.
    The restart is planned from the next scrape, so a copy that reached the PFS must be
    listed complete by it, without another step (the copy lands once the PFS comes back)."""
    guard, manager, train_step = guarded_run(tmp_path, exporter, replication_retry_s=0.2)
    try:
        (tmp_path / "pfs").rename(tmp_path / "pfs-gone")  # the PFS goes away
        train_step()
        manager.save(guard.global_step, stable=True)
        manager.wait()
        train_step()  # the last step: the scan sees the copy waiting for the PFS
        deadline = time.monotonic() + 10
        while not (status := fetch_status(exporter.url, credential=OPERATOR)).inventory:
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
        assert [(r.step, r.pfs.complete) for r in status.inventory] == [(1, False)]
        assert status.replicating == (1,)

        (tmp_path / "pfs-gone").rename(tmp_path / "pfs")  # it is back; no step from here on
        assert not manager.flush(10).timed_out  # the copy landed
        status = fetch_status(
            exporter.url, credential=OPERATOR
        )  # the very next scrape lists it complete
        assert [(r.step, r.pfs.verified) for r in status.inventory] == [(1, True)], status
        assert status.pfs_available is True
        assert status.replicating == ()
    finally:
        manager.close()
        guard.close()


def test_the_heartbeat_counts_training_from_the_end_of_the_restore(
    tmp_path: Path, exporter: AgentExporter
) -> None:
    """The operator's start-up stall bound starts here: the restore's time never counts."""
    before = fetch_status(exporter.url, credential=OPERATOR).heartbeat
    assert before is not None
    assert before.training_since == before.started_at
    guard, manager, _ = guarded_run(tmp_path, exporter)
    try:
        assert manager.restored_at is not None
        assert manager.restored_at > before.started_at
        beat = fetch_status(exporter.url, credential=OPERATOR).heartbeat
        assert beat is not None
        assert beat.training_since == manager.restored_at
        assert beat.steps_completed == 0
    finally:
        manager.close()
        guard.close()


def collective_breaks(guard: Guard) -> None:
    """A rank's loop when gloo ends its collective: the error passes the loop's `finally`."""
    try:
        raise RuntimeError("Connection closed by peer")
    finally:
        guard.close()


def test_training_ending_on_an_error_hands_its_copies_in_flight_over_before_it_stops(
    tmp_path: Path, exporter: AgentExporter
) -> None:
    """A peer was SIGKILLed: gloo ends this rank's collective with an error at once, and the
    loop's `finally` closes the guard. Its copy still on its way to the PFS lands first and
    the agent answers until a scrape listed it; before, the agent went at once and the
    operator planned the restart from an older scrape (no checkpoint verified on the PFS)."""
    guard, manager, train_step = guarded_run(tmp_path, exporter, replication_retry_s=0.2)
    ended = threading.Event()

    def rank_ends() -> None:
        with contextlib.suppress(RuntimeError):
            collective_breaks(guard)
        ended.set()

    url = exporter.url
    try:
        (tmp_path / "pfs").rename(tmp_path / "pfs-gone")
        train_step()
        manager.save(guard.global_step, stable=True)
        manager.wait()
        train_step()
        deadline = time.monotonic() + 10
        while not (status := fetch_status(url, credential=OPERATOR)).inventory:
            assert time.monotonic() < deadline, status
            time.sleep(0.05)
        assert [(r.step, r.pfs.complete) for r in status.inventory] == [(1, False)]

        (tmp_path / "pfs-gone").rename(tmp_path / "pfs")  # the copy can land now
        closing = threading.Thread(target=rank_ends)
        closing.start()
        while not ended.is_set():
            status = fetch_status(url, credential=OPERATOR)  # never refused before the hand-over
            if [(r.step, r.pfs.verified) for r in status.inventory] == [(1, True)]:
                break
            assert time.monotonic() < deadline + HAND_OVER_SECONDS, status
            time.sleep(0.05)
        closing.join(HAND_OVER_SECONDS)
        assert not closing.is_alive(), "the hand-over ends once a scrape listed the copy"
        assert [(r.step, r.pfs.verified) for r in status.inventory] == [(1, True)]
        with pytest.raises(AgentUnreachableError):
            fetch_status(url, credential=OPERATOR)  # and then the agent is gone
    finally:
        manager.close()
        guard.close()


def test_an_error_ends_at_once_when_the_operator_already_read_the_newest_scan(
    tmp_path: Path, exporter: AgentExporter
) -> None:
    guard, manager, train_step = guarded_run(tmp_path, exporter)
    try:
        train_step()
        settled(lambda: manager.scans)
        fetch_status(exporter.url, credential=OPERATOR)  # the operator's scrape
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="closed by peer"):
            collective_breaks(guard)
        assert time.monotonic() - started < 1.0
    finally:
        manager.close()
