"""The attempts one pod runs: the first at start-up, the next ones on the operator's word.

Orders are taken at once and carried out by one worker thread, in order, so an HTTP request
never waits for a grace period, and two orders can never interleave their stop and start.
Fencing: an order for an attempt older than the one this pod runs (or has been told to
run) is refused, so a request delayed in the network cannot bring a fenced-off attempt
back or stop the one that replaced it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from stabletrain_agent.supervisor.launch import Launched, Launcher
from stabletrain_agent.supervisor.output import Tail
from stabletrain_agent.supervisor.processes import Reaper, end_tree
from stabletrain_contract import env
from stabletrain_contract.base import ContractError
from stabletrain_contract.directives import Directives, parse_directives
from stabletrain_contract.supervisor import (
    ENDED_STATES,
    LEFTOVER_MAX,
    MESSAGE_MAX,
    ProcessState,
    StartOrder,
    StopOrder,
    SupervisorReport,
)

_log = logging.getLogger(__name__)

KILL_BOUND_SECONDS = 5.0
"""How long processes may outlive a KILL before the attempt counts as Unkillable: a KILL
ends a process at its next return from the kernel, so within milliseconds unless it is in
uninterruptible sleep. Shorter than the operator's margin after the grace period
(machine.STOP_FORCE_MARGIN, 10 s), so the report says why before the operator gives up on
a pod whose supervisor stays silent."""
ORPHAN_GRACE_SECONDS = 5.0
"""When the launcher ends on its own, what it left running (a worker it could not stop)
gets this long after TERM before KILL: nothing of an ended attempt may keep writing."""
OUTPUT_DRAIN_SECONDS = 1.0
"""How long an ended attempt's last output may take to reach the tail."""


@dataclass
class _Current:
    attempt: int
    state: ProcessState
    started_at: datetime | None = None
    ended_at: datetime | None = None
    exit_code: int | None = None
    message: str = ""
    launched: Launched | None = None
    leftover: tuple[int, ...] = ()
    warm: bool = False
    directives: Directives | None = None


@dataclass(frozen=True)
class AttemptSettings:
    """What every attempt of this pod shares."""

    argv: tuple[str, ...]
    base_env: Mapping[str, str]
    """The container's environment: the first attempt runs with it as it is."""
    local_agent_port: int
    """Where the training agent serves, on 127.0.0.1, behind the supervisor."""
    run_dir: Path
    """Where the directives of later attempts are written for their processes to read."""
    termination_path: Path
    default_grace: float


@dataclass
class _Orders:
    queue: queue.Queue[Callable[[], None]] = field(default_factory=queue.Queue)
    newest: int = -1
    """The newest attempt an accepted order named (fencing)."""


class Attempts:
    """The pod's attempts and the orders that move them."""

    def __init__(
        self, settings: AttemptSettings, launcher: Launcher, reaper: Reaper, tail: Tail
    ) -> None:
        self._settings = settings
        self._launcher = launcher
        self._reaper = reaper
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._tail = tail
        """What the launchers' output pumps keep: the current attempt's output."""
        first = int(settings.base_env.get(env.ATTEMPT, "0") or "0")
        # Running from the start: the pod's own attempt is being started (start_first).
        self._current = _Current(first, ProcessState.RUNNING)
        self._started = 0
        self._orders = _Orders(newest=first)
        self._terminated = False
        """The pod is going (terminate): nothing starts any more."""
        self._worker = threading.Thread(target=self._work, name="orders", daemon=True)
        self._worker.start()

    # ----------------------------------------------------------------- what it reports

    def report(self, *, agent_answered: bool) -> SupervisorReport:
        with self._lock:
            current = self._current
            return SupervisorReport(
                attempt=current.attempt,
                state=current.state,
                started_at=current.started_at,
                ended_at=current.ended_at,
                exit_code=current.exit_code,
                message=current.message[-MESSAGE_MAX:],
                attempts_started=self._started,
                agent_answered=agent_answered,
                leftover_pids=current.leftover[:LEFTOVER_MAX],
                warm=current.warm,
            )

    def directives(self) -> Directives | None:
        """The current attempt's initial directives (None when they could not be read)."""
        with self._lock:
            return self._current.directives

    def ready(self) -> bool:
        """False while an attempt ended without being told to (the kubelet's readiness
        probe turns that into a pod status change the operator watches), or would not die."""
        with self._lock:
            return self._current.state not in (ProcessState.EXITED, ProcessState.UNKILLABLE)

    def completed(self) -> bool:
        """The attempt ended on its own with exit code 0: training is over."""
        with self._lock:
            current = self._current
            return current.state is ProcessState.EXITED and current.exit_code == 0

    def wait_changed(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    # ----------------------------------------------------------------- orders

    def start_first(self) -> None:
        """The attempt the pod was created for, with the container's environment."""
        with self._lock:
            attempt = self._current.attempt
        environment = dict(self._settings.base_env)
        directives = _read_directives(environment.get(env.DIRECTIVES_PATH))
        self._orders.queue.put(lambda: self._launch(attempt, environment, directives))

    def order_start(self, order: StartOrder) -> tuple[bool, str]:
        attempt = order.directives.attempt
        with self._lock:
            if attempt < self._orders.newest:
                return False, f"attempt {attempt} is older than attempt {self._orders.newest}"
            if self._current.state is ProcessState.UNKILLABLE:
                return False, "processes of the previous attempt cannot be ended: replace the pod"
            if attempt == self._orders.newest:
                return True, f"attempt {attempt} already ordered"
            self._orders.newest = attempt
        grace = order.grace_seconds
        self._orders.queue.put(lambda: self._stop(grace, ordered=True))
        environment = self._attempt_env(order)
        self._orders.queue.put(lambda: self._launch(attempt, environment, order.directives))
        return True, f"attempt {attempt} starts once the processes running now have ended"

    def order_stop(self, order: StopOrder) -> tuple[bool, str]:
        with self._lock:
            if order.attempt < self._orders.newest:
                return False, f"attempt {order.attempt} is older than attempt {self._orders.newest}"
            running = self._current.attempt
        if running > order.attempt:
            return False, f"this pod runs attempt {running}, not {order.attempt}"
        self._orders.queue.put(lambda: self._stop(order.grace_seconds, ordered=True))
        return True, f"stopping attempt {running}"

    def terminate(self, grace: float) -> int:
        """The pod is going: end the attempt now (queued orders are dropped) and return the
        exit code the container should end with."""
        with self._lock:
            self._orders.newest = 1 << 62
            self._terminated = True
        self._stop(grace, ordered=False)
        self._launcher.close()
        with self._lock:
            code = self._current.exit_code
        return 143 if code is None else code

    # ----------------------------------------------------------------- the worker

    def _work(self) -> None:
        while True:
            task = self._orders.queue.get()
            try:
                task()
            except Exception:
                _log.exception("supervisor: an order failed")

    def _attempt_env(self, order: StartOrder) -> dict[str, str]:
        directives = order.directives
        path = self._write_directives(directives)
        return {
            **self._settings.base_env,
            env.ATTEMPT: str(directives.attempt),
            env.DIRECTIVES_PATH: str(path),
            env.PET_RDZV_ENDPOINT: order.rendezvous_endpoint,
            env.PET_RDZV_ID: order.rendezvous_id,
            env.PET_MASTER_ADDR: order.master_addr,
        }

    def _write_directives(self, directives: Directives) -> Path:
        self._settings.run_dir.mkdir(parents=True, exist_ok=True)
        path = self._settings.run_dir / f"directives-a{directives.attempt}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(directives.to_json(), encoding="utf-8")
        temporary.replace(path)
        return path

    def _launch(
        self, attempt: int, environment: dict[str, str], directives: Directives | None
    ) -> None:
        with self._lock:
            if self._terminated:
                _log.info("supervisor: the pod is going; attempt %d not started", attempt)
                return
            if self._current.launched is not None and self._current.state not in ENDED_STATES:
                _log.error("supervisor: attempt %d still runs; attempt %d not started",
                           self._current.attempt, attempt)  # fmt: skip
                return
            if self._current.state is ProcessState.UNKILLABLE:
                return
        environment[env.AGENT_PORT] = str(self._settings.local_agent_port)
        environment[env.AGENT_BIND_ADDRESS] = "127.0.0.1"
        environment.setdefault("PYTHONUNBUFFERED", "1")
        self._clear_termination_message()
        self._tail.clear()
        started = datetime.now(UTC)
        try:
            launched = self._launcher.launch(self._settings.argv, environment)
        except OSError as error:
            message = f"cannot start {' '.join(self._settings.argv)}: {error}"
            _log.error("supervisor: %s", message)
            self._set(attempt, ProcessState.EXITED, started, exit_code=127, message=message)
            with self._lock:
                self._current.directives = directives
            return
        self._reaper.watch(launched.pid)
        with self._changed:
            self._started += 1
            self._current = _Current(
                attempt,
                ProcessState.RUNNING,
                started,
                launched=launched,
                warm=launched.warm,
                directives=directives,
            )
            self._changed.notify_all()
            terminated = self._terminated
        if terminated:  # the pod's TERM came while it was being started: end it at once
            self._stop(0.0, ordered=False)
            return
        _log.info("supervisor: attempt %d started (pid %d%s)", attempt, launched.pid,
                  ", warm" if launched.warm else "")  # fmt: skip
        threading.Thread(
            target=self._watch, args=(attempt, launched), name="attempt", daemon=True
        ).start()

    def _watch(self, attempt: int, launched: Launched) -> None:
        """The launcher's exit: an attempt that ended on its own (or one told to stop, whose
        stop records the end itself)."""
        ended = self._reaper.wait(launched.pid, None)
        assert ended is not None
        launched.reaped(ended.code)
        with self._lock:
            if self._current.launched is not launched or self._current.state is not (
                ProcessState.RUNNING
            ):
                return
        leftover = end_tree(
            self._launcher.root,
            excluded=self._launcher.spare_pids(),
            grace=ORPHAN_GRACE_SECONDS,
            kill_bound=KILL_BOUND_SECONDS,
        )
        launched.drain(OUTPUT_DRAIN_SECONDS)
        state = ProcessState.UNKILLABLE if leftover else ProcessState.EXITED
        with self._lock:
            if self._current.launched is not launched or self._current.state is not (
                ProcessState.RUNNING
            ):
                return
        self._end(launched, state, ended.code, ended.at, leftover)
        _log.info("supervisor: attempt %d ended on its own with exit code %d", attempt, ended.code)

    def _stop(self, grace: float, *, ordered: bool) -> None:
        with self._changed:
            current = self._current
            launched = current.launched
            if launched is None or current.state is not ProcessState.RUNNING:
                return
            current.state = ProcessState.STOPPING
            self._changed.notify_all()
        _log.info("supervisor: stopping attempt %d (grace %.0f s)", current.attempt, grace)
        leftover = end_tree(
            self._launcher.root,
            excluded=self._launcher.spare_pids(),
            grace=grace,
            kill_bound=KILL_BOUND_SECONDS,
        )
        ended = self._reaper.wait(launched.pid, 0 if leftover else KILL_BOUND_SECONDS)
        if ended is not None:
            launched.reaped(ended.code)
        launched.drain(OUTPUT_DRAIN_SECONDS)
        if leftover:
            _log.error("supervisor: attempt %d left processes a KILL did not end: %s",
                       current.attempt, leftover)  # fmt: skip
        state = ProcessState.UNKILLABLE if leftover else ProcessState.STOPPED
        code = ended.code if ended is not None else None
        self._end(launched, state, code, ended.at if ended else time.time(), leftover)

    def _end(
        self,
        launched: Launched,
        state: ProcessState,
        code: int | None,
        at: float,
        leftover: tuple[int, ...],
    ) -> None:
        message = self._termination_message() or self._tail.text()
        with self._changed:
            current = self._current
            if current.launched is not launched:
                return
            current.state = state
            current.exit_code = code
            current.ended_at = datetime.fromtimestamp(at, tz=UTC)
            current.message = message[-MESSAGE_MAX:]
            current.leftover = leftover
            self._changed.notify_all()

    def _set(
        self,
        attempt: int,
        state: ProcessState,
        started: datetime,
        *,
        exit_code: int,
        message: str,
    ) -> None:
        with self._changed:
            self._started += 1
            self._current = _Current(
                attempt,
                state,
                started,
                ended_at=datetime.now(UTC),
                exit_code=exit_code,
                message=message[-MESSAGE_MAX:],
            )
            self._changed.notify_all()

    # ----------------------------------------------------------------- the message file

    def _termination_message(self) -> str:
        try:
            return self._settings.termination_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def _clear_termination_message(self) -> None:
        """A new attempt starts with an empty message file, so its agent's completion or
        trip report is written (the agent never overwrites one) and read for it alone. The
        file may be a bind mount: truncated in place, never replaced."""
        try:
            with self._settings.termination_path.open("r+b") as handle:
                handle.truncate(0)
        except FileNotFoundError:
            pass
        except OSError as error:
            _log.warning("supervisor: cannot clear %s: %s", self._settings.termination_path,
                         error)  # fmt: skip


def _read_directives(path: str | None) -> Directives | None:
    """The first attempt's directives from the file its ConfigMap mounts."""
    if not path:
        return None
    try:
        return parse_directives(Path(path).read_text(encoding="utf-8"))
    except (OSError, ContractError) as error:
        _log.warning("supervisor: directives at %s unreadable: %s", path, error)
        return None
