"""One daemon per StableTrainingJob: the job's level-based reconcile loop.

A daemon rather than change handlers because most of what matters does not change the job
object at all: pods end, agents report, time passes. The loop ticks from what kopf's
watches deliver (the job's live body, the pod index) and the agents' scrapes: at once when
the pods or the object changed (a watch event wakes it, handlers/wakeups.py) or a platform
policy or a namespace's labels did (the policy catalog's refresh wakes every daemon,
handlers/policies.py), on its clock
while the phase waits on time, and otherwise only when the job's next scrape round is due
(observe/pacing.py). Between those it sleeps, so a healthy job costs the operator one tick
per round and nothing in between. It reads the job from the API server only when the live
body and the version it last wrote disagree for longer than a watch takes to catch up
(jobview.py), so an idle job costs no API request and no decision is made on a state
older than one it saw. Of the live body it reads the metadata alone, and kopf keeps no more
than that (handlers/live_body.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import kopf

from stabletrain_operator import metrics
from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION
from stabletrain_operator.apiserver import ApiError
from stabletrain_operator.handlers.pod_index import OwnerKey, PodKey
from stabletrain_operator.handlers.wakeups import WakeEvent, Wakeups, sleep_until
from stabletrain_operator.jobview import DEFAULT_PROGRESS_WRITE_SECONDS
from stabletrain_operator.kube import Kube, StaleStatusError
from stabletrain_operator.observe.pod_facts import PodFacts
from stabletrain_operator.queue.facts import WorkloadFacts
from stabletrain_operator.reconcile import JobKey, JobMemory, tick
from stabletrain_operator.shared_field_names import share_field_names

TICK_SECONDS = 0.5
"""The clock of a phase that waits on time (reconcile.JobMemory.next_tick_at is then 0): the
least time between two ticks that no watch event asked for, and the pause after a first
error."""
ERROR_BACKOFF_MAX_SECONDS = 30.0
"""The longest pause after errors in a row: the pause doubles from TICK_SECONDS with each
failed tick, so an error that does not go away (an API server that keeps refusing, a bug a
spec triggers) costs a request every 30 s, not two a second."""
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
    worker_pods: kopf.Index[OwnerKey, PodFacts] = kwargs["worker_pods"]
    """Injected by kopf under the index function's name (handlers/pod_index.py)."""
    job_workloads: kopf.Index[PodKey, WorkloadFacts] | None = kwargs.get("job_workloads")
    """Only with --kueue (handlers/workloads.py)."""
    kube: Kube = memo["kube"]
    key = JobKey(namespace, name)
    wakeups: Wakeups = memo["wakeups"]
    woken = wakeups.register((namespace, name))
    try:
        await _reconcile(
            key, body, worker_pods=worker_pods, job_workloads=job_workloads, kube=kube,
            memo=memo, woken=woken, stopped=stopped,
        )  # fmt: skip
    finally:
        wakeups.unregister((namespace, name), woken)


async def _reconcile(
    key: JobKey,
    body: kopf.Body,
    *,
    worker_pods: kopf.Index[OwnerKey, PodFacts],
    kube: Kube,
    memo: Any,
    woken: WakeEvent,
    stopped: kopf.DaemonStopped,
    job_workloads: kopf.Index[PodKey, WorkloadFacts] | None = None,
) -> None:
    namespace, name = key.namespace, key.name
    memory = JobMemory()
    seen: tuple[object, ...] | None = None
    ticked_at = -TICK_SECONDS
    failures = 0
    while not stopped:
        try:
            memory.woken_at = woken.set_at
            woken.clear()  # before the look: a change after it wakes the sleep below
            indexed = list(worker_pods.get((namespace, name, str(body.metadata.get("uid"))), []))
            workloads = list(job_workloads.get((namespace, name), [])) if job_workloads else []
            catalog = memo.get("policies")
            policies = catalog.changes if catalog is not None else 0
            world = (body.metadata.get("resourceVersion"), policies, *indexed, *workloads)
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
                kueue=memo.get("kueue"),
                workloads=workloads,
                votes=memo.get("node_votes"),
                tenancy=memo.get("tenancy"),
                catalog=memo.get("policies"),
                progress_writes=memo.get("progress_writes"),
            )
            share_field_names(memory)
            failures = 0
        except StaleStatusError:
            metrics.RECONCILE_ERRORS.labels("Conflict").inc()
            alive, seen = True, None  # tick again at once
        except ApiError as error:
            seen, alive, failures = None, True, failures + 1
            metrics.RECONCILE_ERRORS.labels("ApiError").inc()
            pause = _backoff(failures)
            _log.warning("job %s/%s: API error %s %s; retrying in %.1f s", namespace, name,
                         error.status, error.reason, pause)  # fmt: skip
            await stopped.wait(pause)
        except Exception:
            # A bug the job's data triggers: kopf would restart the daemon every second,
            # repeating every request of its first tick; the loop backs off instead.
            seen, alive, failures = None, True, failures + 1
            metrics.RECONCILE_ERRORS.labels("Unexpected").inc()
            pause = _backoff(failures)
            _log.exception("job %s/%s: reconcile failed; retrying in %.1f s", namespace, name,
                           pause)  # fmt: skip
            await stopped.wait(pause)
        if not alive:
            return
        await stopped.wait(EVENT_GAP_SECONDS)


def _backoff(failures: int) -> float:
    """The pause after `failures` failed ticks in a row."""
    return min(TICK_SECONDS * 2.0 ** (failures - 1), ERROR_BACKOFF_MAX_SECONDS)
