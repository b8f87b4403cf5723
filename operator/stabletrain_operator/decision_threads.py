"""Threads of their own for the status writes that carry a decision (a phase, a condition,
a counter), apart from the shared pool of handlers/settings.API_THREADS.

At 1,000 jobs that pool carries some 14 progress writes a second besides the reads and
launches; a trip's write of Stopping queued behind them for up to 2.3 s
(bench/operator_scale.py, its "queued for a thread" stage). Decisions are rare, so a few
threads keep them from waiting behind routine progress.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

DECISION_THREADS = 4
"""With handlers/settings.API_THREADS and kube.FANOUT, within kube.CONNECTION_POOL."""

_pool = ThreadPoolExecutor(max_workers=DECISION_THREADS, thread_name_prefix="decision")


async def on_decision_thread(call: Callable[[], T]) -> T:
    """`call()` on a decision thread, with the caller's context (as asyncio.to_thread)."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(
        _pool, functools.partial(context.run, call)
    )
