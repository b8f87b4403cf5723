"""The operator hands glibc's free heap pages back: blocks over Python's 512-byte limit
freed between ones still alive stay in the process until malloc_trim returns them."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from stabletrain_operator.heap_trim import malloc_trim, trim_every


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_freed_blocks_between_live_ones_go_back_to_the_system_when_trimmed() -> None:
    trim = malloc_trim()
    if trim is None:
        pytest.skip("this C library has no malloc_trim")
    blocks = [bytes(2000) for _ in range(100_000)]  # 200 MB from malloc, not pymalloc
    kept = blocks[::8]
    del blocks  # seven in eight freed, in holes glibc cannot give back by itself
    before = rss_mib()
    trim(0)
    after = rss_mib()
    assert before - after > 100, (before, after)
    assert len(kept) == 12_500


def test_the_trim_task_runs_until_cancelled() -> None:
    async def scenario() -> bool:
        task = asyncio.create_task(trim_every(0.01))
        await asyncio.sleep(0.1)
        running = not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return running

    assert asyncio.run(scenario())
