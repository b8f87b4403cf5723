"""Progress-only status writes take at most their share of the API pool, so a decision never
waits behind them for a thread (handlers/startup.py, PROGRESS_WRITE_THREADS).

At 1,000 jobs the healthy jobs' progress writes filled all 16 threads while the API server
answered slowly, and a trip's decision waited up to 2.3 s for one (bench/operator_scale.py,
"queued for a thread").
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from operator_builders import spec

from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.jobview import JobView
from stabletrain_operator.reconcile import JobKey, JobMemory, _record

RUNNING = StableTrainingJobStatus(phase=Phase.RUNNING, step=10)
PROGRESSED = RUNNING.model_copy(update={"step": 11})
STOPPING = RUNNING.model_copy(update={"phase": Phase.STOPPING})


class SlowApiServer:
    """Holds every progress write until released, as an API server under load does; a
    decision (any phase but Running) is answered at once."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def write_status(self, namespace: str, name: str, version: str, status: Any) -> Any:
        if status.get("phase") == Phase.RUNNING.value:
            self.release.wait(timeout=10)
        return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": "2"}}


def decision_waited(progress_writes: asyncio.Semaphore | None) -> bool:
    """Four jobs' progress writes and then one job's decision, on a pool of two threads;
    True when the decision was not written while the progress writes were held."""
    api = SlowApiServer()

    def held() -> tuple[JobView, JobMemory]:
        job = {"metadata": {"name": "j", "namespace": "ns", "uid": "u", "resourceVersion": "1"}}
        view = JobView("1", job, spec(), RUNNING, obtained_at=0.0)
        return view, JobMemory(view=view)

    async def record(name: str, status: StableTrainingJobStatus) -> bool:
        view, memory = held()
        return await _record(api, JobKey("ns", name), view, status, memory,  # type: ignore[arg-type]
                             progress_seconds=0.0, progress_writes=progress_writes)  # fmt: skip

    async def run() -> bool:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))
        progress = [asyncio.create_task(record(f"p{i}", PROGRESSED)) for i in range(4)]
        await asyncio.sleep(0.1)
        decision = record("tripped", STOPPING)
        try:
            await asyncio.wait_for(decision, timeout=2.0)
            waited = False
        except TimeoutError:
            waited = True
        api.release.set()
        await asyncio.gather(*progress)
        return waited

    return asyncio.run(run())


def test_a_decision_finds_a_thread_while_progress_writes_wait() -> None:
    assert not decision_waited(asyncio.Semaphore(1))


def test_without_the_cap_the_decision_waits_behind_them() -> None:
    """The situation the cap removes, shown on the same pool."""
    assert decision_waited(None)
