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
"""The clock of a phase that waits on time (reconcile.JobMemory.next_tick_at is then 0): the
least time between two ticks that no watch event asked for, and the pause after an API
error."""
EVENT_GAP_SECONDS = 0.1
"""The least time between two ticks of one job, when a watch event of its pods or its object
asks for the second. The ranks of a trip end within milliseconds, but kopf hands on each
pod's event by itself, after its own 0.1 s batch window: the first tick often sees some of
the reports and waits for the rest. With the gap at 0.5 s the rest were acted on half a
second later (bench/operator_scale.py, 100 jobs: trip to Stopping 0.63 s at the median,
0.17 s with this gap)."""

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
    ticked_at = -TICK_SECONDS
    while not stopped:
        try:
            woken.clear()  # before the look: a change after it wakes the sleep below
            indexed = list(worker_pods.get((namespace, name), []))
            world = (body.metadata.get("resourceVersion"), *indexed)
            due = max(memory.next_tick_at, ticked_at + TICK_SECONDS)
            if world == seen and time.monotonic() < due:
                await sleep_until(woken, due)
                continue
            seen, ticked_at = world, time.monotonic()
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
                catalog=memo.get("policies"),
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
            await stopped.wait(TICK_SECONDS)
        if not alive:
            return
        await stopped.wait(EVENT_GAP_SECONDS)
