"""Every Guard.close of a test, for the framework callbacks' exits (tests/torch/conftest.py
sets up the pod's environment and installs the recording)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class GuardCloses:
    """Each Guard.close of a test, with the exception in flight when it ran (what it decides
    the checkpoint hand-over on), and the threads that existed before the test."""

    in_flight: list[type[BaseException] | None] = field(default_factory=list)
    threads_before: set[threading.Thread] = field(
        default_factory=lambda: set(threading.enumerate())
    )

    def replicators_left(self) -> list[threading.Thread]:
        """Checkpoint replication threads the test started that still run."""
        started = set(threading.enumerate()) - self.threads_before
        return [t for t in started if t.name == "stabletrain-replicator"]
