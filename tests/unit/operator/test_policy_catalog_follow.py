"""The policy catalog's background refresh tells the operator when a job's effective policy
may have changed: a job that waits for a change (finished, suspended by its spec) has no
scrape round that would pick a new platform default up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stabletrain_operator.handlers.wakeups import Wakeups
from stabletrain_operator.platform_policy import catalog as catalog_module
from stabletrain_operator.platform_policy.catalog import PolicyCatalog


class Reader:
    def __init__(self) -> None:
        self.labels = {"team": "a"}

    def list_policies(self) -> list[dict[str, Any]]:
        return []

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        return dict(self.labels)


def test_a_change_the_refresh_finds_wakes_every_job_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog_module, "REFRESH_SECONDS", 0.01)
    reader = Reader()
    catalog = PolicyCatalog(reader)
    calls: list[int] = []

    async def scenario() -> list[int]:
        wakeups = Wakeups()
        woken = wakeups.register(("ns", "job"))

        def changed() -> None:
            calls.append(catalog.revision)
            wakeups.wake_all()

        follow = asyncio.create_task(catalog.follow(changed))
        catalog.read_labels("ns")  # a job's first read: that job recomputes, nobody else
        await asyncio.sleep(0.05)
        assert calls == [], "nothing changed: nobody woken"
        reader.labels = {"team": "b"}
        catalog.read_labels("ns")  # read again by a tick: the namespace's labels changed
        await asyncio.wait_for(woken.wait(), 1.0)
        await asyncio.sleep(0.05)
        follow.cancel()
        return calls

    assert asyncio.run(scenario()) == [2], "woken once, for the one change"
