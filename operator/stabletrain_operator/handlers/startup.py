"""kopf settings chosen for recovery within seconds and for clean test namespaces.

- kopf's own progress and diff-base go to annotations: the CRD's structural schema prunes
  undeclared status fields, which would silently eat kopf's default status storage.
- Short retry delays: kopf's default 60 s backoff alone would miss the recovery targets.
- Watch timeouts so a silently dead watch connection is replaced within a minute.
- Our own Events only (kopf's handler-log Events off): every Event is a decision, posted
  after the status write that records it.
- One HTTP session and concurrency cap for every job's agent scrapes (observe/scrape.py),
  made in the operator's event loop and closed when the operator stops, and one scrape
  budget (`--scrape-rate`, observe/pacing.py) shared by every job, with the probe of the
  loop's lag that lowers it while the loop falls behind.
- One thread pool of API_THREADS for every blocking API call the daemons make
  (asyncio.to_thread), instead of asyncio's default of cores + 4 (6 on a 2-core machine),
  of which progress-only status writes take at most half.
- A task that hands glibc's free heap pages back every 10 s (heap_trim.py).
- Daemons make kopf put a finalizer on every job (it must stop the daemon before the object
  goes); it is removed as soon as the job is deleted while the operator runs, so tests
  delete their jobs before they stop the operator (see docs/operator.md).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from stabletrain_operator.api.constants import GROUP
from stabletrain_operator.apiserver import ApiServer
from stabletrain_operator.credentials import credentials
from stabletrain_operator.heap_trim import trim_every
from stabletrain_operator.kube import Kube
from stabletrain_operator.observe.pacing import DEFAULT_SCRAPE_RATE, ScrapePacer
from stabletrain_operator.observe.scrape import Scraper


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.posting.enabled = False
    settings.batching.error_delays = (1, 1, 2, 3, 5, 10)
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 30
    settings.peering.mandatory = False
    memo["kube"] = Kube(ApiServer())


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's watches log in as the operator's own requests do (credentials.py)."""
    return credentials()


API_THREADS = 16
"""Threads for the daemons' blocking API calls (status writes, pod deletes, launches, reads).
With asyncio's default of 6 on 2 cores, 1,000 jobs queued each tick's calls behind some 30
others a second: 3-15 s per hop, and a trip waited for several (bench/operator_scale.py).
Below kube.CONNECTION_POOL, which also serves the fan-out of a big job's pods."""


PROGRESS_WRITE_THREADS = API_THREADS // 2
"""The most threads of the pool that progress-only status writes take at once. They are
most of the operator's writes (every healthy job's, once per progressWriteSeconds), and when
the API server answers slowly they filled the whole pool: at 1,000 jobs a trip's decision
waited up to 2.3 s behind them for a thread (bench/operator_scale.py, "queued for a
thread"). The rest of the pool is left to decisions and every other call."""


@kopf.on.startup()
async def api_threads(memo: kopf.Memo, **_: Any) -> None:
    """Async, so the pool and the progress writes' semaphore belong to the operator's own
    event loop."""
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=API_THREADS, thread_name_prefix="api")
    )
    memo["progress_writes"] = asyncio.Semaphore(PROGRESS_WRITE_THREADS)


@kopf.on.startup()
async def open_scraper(memo: kopf.Memo, **_: Any) -> None:
    """Async, so the session and its semaphore belong to the operator's event loop."""
    memo["scraper"] = Scraper()
    pacer = ScrapePacer(memo.get("scrape_rate", DEFAULT_SCRAPE_RATE))
    memo["pacer"] = pacer
    memo["loop_probe"] = asyncio.create_task(pacer.follow_loop(), name="loop-lag-probe")


@kopf.on.cleanup()
async def close_scraper(memo: kopf.Memo, **_: Any) -> None:
    probe: asyncio.Task[None] | None = memo.get("loop_probe")
    if probe is not None:
        probe.cancel()
    scraper: Scraper | None = memo.get("scraper")
    if scraper is not None:
        await scraper.close()


@kopf.on.startup()
async def start_heap_trim(memo: kopf.Memo, **_: Any) -> None:
    memo["heap_trim"] = asyncio.create_task(trim_every(), name="heap-trim")


@kopf.on.cleanup()
async def stop_heap_trim(memo: kopf.Memo, **_: Any) -> None:
    trim: asyncio.Task[None] | None = memo.get("heap_trim")
    if trim is not None:
        trim.cancel()
