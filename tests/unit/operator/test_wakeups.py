"""A job's daemon sleeps until its next tick is due or a watch event of its pods or its
object wakes it; a wake that comes while it looks at the world is not lost."""

from __future__ import annotations

import asyncio
import time

from stabletrain_operator.handlers.wakeups import Wakeups, sleep_until


def test_nobody_wakes_it_and_it_sleeps_until_the_deadline() -> None:
    woken = Wakeups().register(("ns", "job"))
    began = time.monotonic()
    assert asyncio.run(sleep_until(woken, began + 0.2)) is False
    assert time.monotonic() - began >= 0.2


def test_a_wake_for_its_job_ends_the_sleep_at_once() -> None:
    async def scenario() -> tuple[bool, float]:
        wakeups = Wakeups()
        woken = wakeups.register(("ns", "job"))
        asyncio.get_running_loop().call_later(0.05, wakeups.wake, ("ns", "job"))
        began = time.monotonic()
        result = await sleep_until(woken, began + 30)
        return result, time.monotonic() - began

    woken, slept = asyncio.run(scenario())
    assert woken
    assert slept < 5


def test_a_wake_before_the_sleep_is_kept_and_other_jobs_wakes_are_not_its_own() -> None:
    wakeups = Wakeups()
    mine = wakeups.register(("ns", "job"))
    wakeups.wake(("ns", "other"))
    wakeups.wake(("elsewhere", "job"))
    assert not mine.is_set()
    wakeups.wake(("ns", "job"))  # while the daemon looked at its pods
    assert asyncio.run(sleep_until(mine, time.monotonic() + 30)) is True


def test_a_restarted_daemon_keeps_its_event_when_the_old_one_unregisters_late() -> None:
    wakeups = Wakeups()
    old = wakeups.register(("ns", "job"))
    wakeups.unregister(("ns", "job"), old)
    new = wakeups.register(("ns", "job"))
    wakeups.unregister(("ns", "job"), old)  # the old daemon's finally, after the new one began
    wakeups.wake(("ns", "job"))
    assert new.is_set()
    assert len(wakeups) == 1


def test_a_wake_remembers_its_first_moment_until_the_daemon_clears_it() -> None:
    wakeups = Wakeups()
    woken = wakeups.register(("ns", "job"))
    assert woken.set_at is None
    before = time.monotonic()
    wakeups.wake(("ns", "job"))
    first = woken.set_at
    assert first is not None
    assert first >= before
    wakeups.wake(("ns", "job"))  # a second event before the tick: the wait began at the first
    assert woken.set_at == first
    woken.clear()
    assert woken.set_at is None
