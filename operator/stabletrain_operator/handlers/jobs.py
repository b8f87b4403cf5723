"""One daemon per StableTrainingJob: the job's level-based reconcile loop.

A daemon rather than change handlers because most of what matters does not change the job
object at all: pods end, agents report, time passes. The loop ticks from what kopf's
watches deliver (the job's live body, the pod index) and the agents' scrapes: at once when
the pods or the object changed (a watch event wakes it, handlers/wakeups.py), on its clock
while the phase waits on time, and otherwise only when the job's next scrape round is due
(observe/pacing.py). Between those it sleeps, so a healthy job costs the operator one tick
per round and nothing in between. It reads the job from the API server only when the live
body and the version it last wrote disagree for longer than a watch takes to catch up
(jobview.py), so an idle job costs no API request and no decision is made on a state
older than one it saw.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from stabletrain_operator import metrics
from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION
from stabletrain_operator.handlers.pod_index import PodKey
from stabletrain_operator.handlers.wakeups import Wakeups, sleep_until
from stabletrain_operator.jobview import DEFAULT_PROGRESS_WRITE_SECONDS
from stabletrain_operator.kube import Kube, StaleStatusError
from stabletrain_operator.observe.pods import PodFacts
from stabletrain_operator.reconcile import JobKey, JobMemory, tick

TICK_SECONDS = 0.5
"""The least time between two ticks of one job, and the clock of a phase that waits on time
(reconcile.JobMemory.next_tick_at is then 0)."""

_log = logging.getLogger(__name__)


@kopf.daemon(GROUP, VERSION, PLURAL, initial_delay=0, backoff=1.0, cancellation_timeout=10.0)
async def run_job(
    *,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    memo: Any,
    **kwargs: Any,
) -> None:
    if namespace is None:
        return
    worker_pods: kopf.Index[PodKey, PodFacts] = kwargs["worker_pods"]
    """Injected by kopf under the index function's name (handlers/pod_index.py)."""
    kube: Kube = memo["kube"]
    key = JobKey(namespace, name)
    wakeups: Wakeups = memo["wakeups"]
    woken = wakeups.register((namespace, name))
    try:
        await _reconcile(
            key, body, worker_pods=worker_pods, kube=kube, memo=memo, woken=woken, stopped=stopped
        )
    finally:
        wakeups.unregister((namespace, name), woken)


async def _reconcile(
    key: JobKey,
    body: kopf.Body,
    *,
    worker_pods: kopf.Index[PodKey, PodFacts],
    kube: Kube,
    memo: Any,
    woken: asyncio.Event,
    stopped: kopf.DaemonStopped,
) -> None:
    namespace, name = key.namespace, key.name
    memory = JobMemory()
    seen: tuple[object, ...] | None = None
    while not stopped:
        try:
            woken.clear()  # before the look: a change after it wakes the sleep below
            indexed = list(worker_pods.get((namespace, name), []))
            world = (body.metadata.get("resourceVersion"), *indexed)
            if world == seen and time.monotonic() < memory.next_tick_at:
                await sleep_until(woken, memory.next_tick_at)
                continue
            seen = world
            alive = await tick(
                kube,
                key,
                body,
                indexed,
                memory,
                remediation=memo.get("remediation"),
                progress_seconds=memo.get("progress_write_seconds", DEFAULT_PROGRESS_WRITE_SECONDS),
                scraper=memo.get("scraper"),
                pacer=memo.get("pacer"),
            )
        except StaleStatusError:
            metrics.RECONCILE_ERRORS.labels("Conflict").inc()
            alive, seen = True, None  # tick again at once
        except ApiException as error:
            seen = None
            metrics.RECONCILE_ERRORS.labels("ApiError").inc()
            _log.warning("job %s/%s: API error %s %s; retrying", namespace, name, error.status,
                         error.reason)  # fmt: skip
            alive = True
        if not alive:
            return
        await stopped.wait(TICK_SECONDS)
