"""Hands the C heap's free pages back to the system every 10 seconds.

Python keeps objects of up to 512 bytes in its own arenas and returns an arena once it is
empty; larger ones (the dicts of a job's status and spec as JSON, a decoded watch event,
an HTTP body) come from glibc's malloc. A job's tick frees and allocates such blocks all
the time, and glibc keeps the freed pages inside its heap for reuse rather than unmapping
them: at 1,000 jobs 38 MiB of the operator's 310 MiB were free glibc pages, and one
`malloc_trim(0)` took the process from 304 to 280 MiB (docs/operations.md, "Memory").
Trimmed once a minute, the heap still swung between 24 and 47 MiB from one reading to the
next at 1,000 jobs; every 10 s it stays at 25-32 MiB once the jobs run.
Without glibc (another C library) there is nothing to call and nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable

TRIM_INTERVAL_SECONDS = 10.0
"""Often enough that the pages a burst of ticks freed go back within seconds. A trim walks the
whole heap (some 7 ms for 300 MB with little free and 32 ms with 260 MB free, measured on
this project's 2-core CI machine), so it runs on a thread of the API pool: ctypes lets go of
the interpreter for the call, and the event loop waits for it only if it needs the heap's
lock meanwhile."""

_log = logging.getLogger(__name__)


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    trim: Callable[[int], int] | None = getattr(libc, "malloc_trim", None)
    return trim


async def trim_every(seconds: float = TRIM_INTERVAL_SECONDS) -> None:
    """Runs until cancelled; returns at once without glibc."""
    trim = malloc_trim()
    if trim is None:
        _log.info("no malloc_trim in this C library: the heap is not trimmed")
        return
    while True:
        await asyncio.sleep(seconds)
        began = time.perf_counter()
        await asyncio.to_thread(trim, 0)
        _log.debug("heap trimmed in %.1f ms", 1000 * (time.perf_counter() - began))
