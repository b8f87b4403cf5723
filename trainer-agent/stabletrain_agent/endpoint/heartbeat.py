"""The serving rank's heartbeat: what it last finished, when, and where it is now.

The training thread only stamps the end of each step (`completed`: a float and a few
assignments under a lock). Everything else happens in the exporter's HTTP thread when the
operator asks (`read`): it looks at the training thread's Python stack, so a rank blocked
in a gloo or NCCL collective (which releases the GIL) still answers and says where it
waits, and the rank that stopped first is told apart by being somewhere else (its own
code, a data loader, a sleep). Torch-free: the stack is classified by module name.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType

from stabletrain_contract.channel import FRAME_MAX, Heartbeat, ThreadPlace

RECENT_STEPS = 32
"""Step gaps kept for `slowest_step_seconds`: enough to include a checkpoint save at any
usual interval, few enough that a slow start-up is forgotten once training runs."""
_CHECKPOINT_MODULE = "stabletrain_agent.checkpoint"


def _module(frame: FrameType) -> str:
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else ""


def _is_stdlib(module: str) -> bool:
    return module.split(".", 1)[0] in sys.stdlib_module_names


def _is_torch(module: str) -> bool:
    return module == "torch" or module.startswith("torch.")


def _describe(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_filename}:{frame.f_lineno} {code.co_name}"[-FRAME_MAX:]


def classify(frame: FrameType | None) -> tuple[ThreadPlace, str]:
    """Where a thread whose innermost frame is `frame` is, and its innermost own frame.

    A checkpoint frame anywhere on the stack means a save or a restore. Otherwise the
    innermost frame that is not the standard library decides: torch means waiting in torch
    (collectives release the GIL inside torch's Python wrappers), anything else means the
    thread is in the script's own code. The frame shown is the innermost one that is
    neither torch nor the standard library: the line a person looks at.
    """
    if frame is None:
        return ThreadPlace.GONE, ""
    place: ThreadPlace | None = None
    shown = ""
    current: FrameType | None = frame
    while current is not None:
        module = _module(current)
        if module.startswith(_CHECKPOINT_MODULE):
            return ThreadPlace.CHECKPOINT, _describe(current)
        if not _is_stdlib(module):
            if place is None:
                place = ThreadPlace.TORCH if _is_torch(module) else ThreadPlace.ELSEWHERE
            if not shown and not _is_torch(module):
                shown = _describe(current)
        current = current.f_back
    return place or ThreadPlace.ELSEWHERE, shown


class HeartbeatClock:
    """Stamped by the training thread at each completed step, read by the HTTP thread."""

    def __init__(
        self,
        *,
        rank: int,
        clock: Callable[[], datetime],
        stamp: Callable[[], float] = time.time,
        thread: int | None = None,
    ) -> None:
        """`clock` tells the start; `stamp` (seconds since the epoch) each step's end: a
        float read is a fraction of building a datetime, which inside a framework's fit cost
        the training thread ~10 us a step. The datetimes are made when read."""
        self._rank = rank
        self._started_at = clock()
        self._stamp = stamp
        self._training_since = self._started_at
        self._thread = thread if thread is not None else threading.get_ident()
        self._lock = threading.Lock()
        self._completed = 0
        self._last_step: int | None = None
        self._last_at: float | None = None
        self._stamps: deque[float] = deque(maxlen=RECENT_STEPS + 1)
        """When the recent steps completed; their gaps are worked out when read."""

    def completed(self, step: int) -> None:
        """The calling (training) thread finished `step`; it is the thread watched from now."""
        now = self._stamp()
        with self._lock:
            self._stamps.append(now)
            self._thread = threading.get_ident()
            self._completed += 1
            self._last_step = step
            self._last_at = now

    def began_training(self, at: datetime) -> None:
        """The process's restore finished at `at`: its start-up is measured from then on."""
        with self._lock:
            self._training_since = max(at, self._started_at)

    def read(self) -> Heartbeat:
        """The heartbeat as of now; safe from any thread, never blocks on training."""
        with self._lock:
            completed, last_step, last_at = self._completed, self._last_step, self._last_at
            stamps = tuple(self._stamps)
            thread = self._thread
            training_since = self._training_since
        gaps = [max(b - a, 0.0) for a, b in itertools.pairwise(stamps)]
        slowest = max(gaps) if gaps else None
        place, frame = classify(sys._current_frames().get(thread))
        return Heartbeat(
            rank=self._rank,
            started_at=self._started_at,
            training_since=training_since,
            steps_completed=completed,
            last_step=last_step,
            last_step_at=None if last_at is None else datetime.fromtimestamp(last_at, UTC),
            slowest_step_seconds=slowest,
            in_step=completed > 0 and place is not ThreadPlace.GONE,
            place=place,
            frame=frame,
        )
