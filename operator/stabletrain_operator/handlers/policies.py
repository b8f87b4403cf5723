"""The platform policies every job's daemon reads (platform_policy/catalog.py): listed once
before any job is served, so no job starts without its namespace's defaults and limits,
then refreshed in the background; a change wakes every job's daemon."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from stabletrain_operator.handlers.wakeups import Wakeups
from stabletrain_operator.platform_policy.catalog import PolicyCatalog


@kopf.on.startup()
async def load_policies(memo: kopf.Memo, **_: Any) -> None:
    catalog = PolicyCatalog(memo["kube"])
    await asyncio.to_thread(catalog.refresh)
    memo["policies"] = catalog
    memo["policy_refresh"] = asyncio.create_task(
        catalog.follow(changed=lambda: _wake_every_job(memo)), name="policy-refresh"
    )


def _wake_every_job(memo: kopf.Memo) -> None:
    """A policy or a namespace's labels changed: every job's effective policy may have. A
    running job would see it at its next round; a finished or suspended one has none."""
    wakeups: Wakeups | None = memo.get("wakeups")
    if wakeups is not None:
        wakeups.wake_all()


@kopf.on.cleanup()
async def stop_policies(memo: kopf.Memo, **_: Any) -> None:
    refresh: asyncio.Task[None] | None = memo.get("policy_refresh")
    if refresh is not None:
        refresh.cancel()
