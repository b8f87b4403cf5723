"""A status write that carries a decision does not queue behind the shared API pool."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.decision_threads import on_decision_thread
from stabletrain_operator.jobview import beyond_progress


def test_a_decision_runs_while_every_thread_of_the_api_pool_is_busy() -> None:
    release = threading.Event()

    async def scenario() -> str:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
        busy = [asyncio.create_task(asyncio.to_thread(release.wait, 30)) for _ in range(4)]
        await asyncio.sleep(0.05)
        try:
            return await asyncio.wait_for(
                on_decision_thread(lambda: threading.current_thread().name), timeout=5
            )
        finally:
            release.set()
            await asyncio.gather(*busy)

    assert asyncio.run(scenario()).startswith("decision")


def test_progress_numbers_alone_are_not_a_decision_and_a_phase_is() -> None:
    before = StableTrainingJobStatus(phase=Phase.RUNNING, step=10, loss=2.5)
    assert not beyond_progress(before, before.model_copy(update={"step": 11, "loss": 2.4}))
    assert beyond_progress(before, before.model_copy(update={"phase": Phase.STOPPING}))
