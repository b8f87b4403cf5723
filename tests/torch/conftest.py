"""Shared fixtures of the torch tests: counting host synchronisations from the outside, and
a pod's environment with every Guard.close recorded (the framework callbacks' exits)."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from stabletrain_agent.guard import Guard
from stabletrain_contract import env
from support.guard_closes import GuardCloses

SYNC_POINTS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "cpu", "numpy")
"""Tensor methods that make the host wait for the device (or read a value to the host)."""


class SyncCounter:
    """Counts calls of every sync point while installed; the code under test cannot see it."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def reset(self) -> None:
        self.calls.clear()

    def wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counting(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return original(*args, **kwargs)

        return counting


@pytest.fixture
def sync_counter(monkeypatch: pytest.MonkeyPatch) -> SyncCounter:
    counter = SyncCounter()
    for name in SYNC_POINTS:
        monkeypatch.setattr(torch.Tensor, name, counter.wrap(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(
        torch.cuda, "synchronize", counter.wrap("cuda.synchronize", torch.cuda.synchronize)
    )
    return counter


TINY_GPT = Path(__file__).resolve().parents[2] / "examples" / "tiny-gpt" / "model.py"


def load_tiny_gpt() -> ModuleType:
    """The example's model module (its directory name is not a package name)."""
    spec = importlib.util.spec_from_file_location("tiny_gpt_model", TINY_GPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_gpt() -> ModuleType:
    return load_tiny_gpt()


@pytest.fixture
def guard_closes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GuardCloses:
    """A pod's environment under `tmp_path` (tiers, attempt 0, the agent on a free loopback
    port), with every Guard.close recorded."""
    for name, where in (
        (env.LOCAL_CHECKPOINT_DIR, "local"),
        (env.PFS_CHECKPOINT_DIR, "pfs"),
        (env.LINEAGE_DIR, "lineage"),
    ):
        monkeypatch.setenv(name, str(tmp_path / where))
    monkeypatch.setenv(env.ATTEMPT, "0")
    monkeypatch.setenv(env.AGENT_BIND_ADDRESS, "127.0.0.1")
    monkeypatch.setenv(env.AGENT_PORT, "0")
    closes = GuardCloses()
    close = Guard.close

    def recording_close(guard: Guard) -> None:
        closes.in_flight.append(sys.exc_info()[0])
        close(guard)

    monkeypatch.setattr(Guard, "close", recording_close)
    return closes
