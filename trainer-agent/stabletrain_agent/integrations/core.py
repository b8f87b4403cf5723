"""What the Lightning and HF Trainer adapters share: process group, tiers, guarded step.

Frameworks own their optimizer step: they call ``optimizer.step(closure)`` themselves, and
Lightning runs the forward and backward inside that closure. The guard must decide before
the update whether it happens at all (a non-finite or tripping step never reaches the
weights), so ``GuardedOptimizer`` replaces the ``step`` of the one optimizer instance the
framework steps: the framework's call runs the closure, hands the loss to ``guard.step``,
and the guard's own ``optimizer.step()`` reaches the real step under the directives' LR
scale. Nothing else about the optimizer changes; ``uninstall`` puts the original back.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import torch
import torch.distributed as dist

from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager, RestoreResult
from stabletrain_agent.checkpoint.planned import restore_planned
from stabletrain_agent.checkpoint.replicate import FlushResult, PfsCondition
from stabletrain_agent.checkpoint.states import RngState, Stateful
from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.gather_preflight import preflight_requested
from stabletrain_agent.guard import Guard, GuardEnv
from stabletrain_contract import env
from stabletrain_contract.channel import RejectedCopy
from stabletrain_contract.checkpoint.inventory import CheckpointRecord
from stabletrain_contract.checkpoint.settings import CheckpointSettings
from stabletrain_contract.signals.monitor import Verdict


def init_process_group_from_env() -> None:
    """Join torchrun's process group now, so the checkpoints can be restored before the fit.

    Both frameworks reuse a group that is already initialized (Lightning's DDP strategy
    and accelerate check first), so the restore that must happen before they build their
    state can run collectives. Outside torchrun (no WORLD_SIZE) the run is one process.
    """
    if int(os.environ.get(env.WORLD_SIZE, "1")) <= 1 or dist.is_initialized():
        return
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


def restore_directed(manager: CheckpointManager) -> RestoreResult | None:
    """Restore exactly the step the operator's directives name (0: nothing), before the fit.

    Standalone (no directives) the newest restorable checkpoint is resumed. A planned step
    that cannot be restored stops the process with RestoreFailed (checkpoint/planned.py).
    """
    return restore_planned(
        manager,
        DirectiveSource.from_env().latest(),
        termination_path=GuardEnv.from_environ().termination_path,
    )


def start_checkpoints(
    app_state: Mapping[str, Stateful], rank_state: Mapping[str, Stateful]
) -> tuple[CheckpointManager | None, RestoreResult | None]:
    """The pod's checkpoint manager and the restore its directives name, before the fit;
    (None, None) in the preflight pod, which only gathers facts (Guard.from_env exits).

    Without the memory tier: the framework's state exists only as the checkpoint it builds
    at its own save steps (FrameworkCheckpoints), so snapshots between them cannot be
    taken, and staging buffers for them would only cost memory."""
    if preflight_requested():
        return None, None
    init_process_group_from_env()
    config = dataclasses.replace(CheckpointConfig.from_env(), memory_root=None)
    manager = CheckpointManager(config, app_state, rank_state)
    return manager, restore_directed(manager)


def interval_steps(manager: CheckpointManager | None) -> int:
    """spec.checkpoints.intervalSteps, from the manager or (preflight pod) the env."""
    if manager is None:
        return CheckpointConfig.from_env().interval_steps
    return manager.config.interval_steps


class FrameworkCheckpoints:
    """The manager as the guard sees it inside a framework: saves go through the framework.

    The guard saves by itself when the operator requests a checkpoint before suspending,
    from inside the optimizer step. A framework's checkpoint can only be taken between its
    steps (its loop counters are mid-step there), so that request is declined: the guard
    reports no checkpoint and the operator resumes from the newest one the framework saved.
    For the same reason the guard's memory-tier snapshots are not taken under a framework:
    its state exists only as the checkpoint the framework builds at its save steps.
    """

    def __init__(self, manager: CheckpointManager) -> None:
        self.manager = manager

    def inventory(self) -> Sequence[CheckpointRecord]:
        return self.manager.inventory()

    def rejected(self) -> Sequence[RejectedCopy]:
        return self.manager.rejected()

    def is_save_step(self, step: int) -> bool:
        return self.manager.is_save_step(step)

    def apply_settings(self, settings: CheckpointSettings) -> None:
        self.manager.apply_settings(settings)

    def save(self, step: int, **marks: Any) -> None:
        raise RuntimeError(
            f"step {step}: the framework's checkpoints are taken between its steps, not on "
            "request from inside one; the newest saved checkpoint stays the resume point"
        )

    def snapshot(self, step: int, *, stable: bool) -> bool:
        return False

    def wait(self) -> None:
        self.manager.wait()

    def flush(self, deadline_s: float, before_step: int | None = None) -> FlushResult:
        return self.manager.flush(deadline_s, before_step)

    @property
    def inventory_version(self) -> int:
        return self.manager.inventory_version

    @property
    def pfs_condition(self) -> PfsCondition:
        return self.manager.pfs_condition

    @property
    def replicating(self) -> tuple[int, ...] | None:
        return self.manager.replicating

    @property
    def restored_at(self) -> datetime | None:
        return self.manager.restored_at


@dataclass(frozen=True)
class SaveMarks:
    """How a checkpoint is filed: one taken inside an anomaly is evidence, never resumed."""

    stable: bool
    spike_marker: bool
    anomalies: tuple[str, ...]
    baseline: dict[str, float]

    @classmethod
    def of(cls, guard: Guard | None, verdict: Verdict | None) -> SaveMarks:
        findings = verdict.findings if verdict is not None else ()
        baseline: dict[str, float] = {}
        if guard is not None:
            loss_baseline = guard.monitor.snapshot().loss_baseline
            if loss_baseline is not None:
                baseline["loss"] = loss_baseline
        return cls(
            stable=not findings,
            spike_marker=bool(findings),
            anomalies=tuple(str(f.signal) for f in findings),
            baseline=baseline,
        )

    def as_kwargs(self) -> dict[str, Any]:
        return {
            "stable": self.stable,
            "spike_marker": self.spike_marker,
            "anomalies": self.anomalies,
            "baseline": self.baseline,
        }


class BlobState:
    """One opaque value checkpointed as a single serialized item, restored before its owner.

    torch.distributed.checkpoint loads into a template of the same keys and tensor shapes,
    which a process that has not built the framework's state yet cannot offer (a fresh
    optimizer has no state). A framework's checkpoint travels as one blob instead; the
    framework restores it through its own loading path. The blob is read back only from a
    copy signed with the job's key, and even then with `weights_only=True`: tensors,
    containers and plain values, never arbitrary classes (checkpoint/safe_load.py).
    """

    def __init__(self, source: Callable[[], object]) -> None:
        self._source = source
        self.loaded: Any = None
        """The value of the checkpoint restored last (None: nothing restored)."""

    def state_dict(self) -> dict[str, Any]:
        buffer = io.BytesIO()
        torch.save(self._source(), buffer)
        return {"blob": buffer.getvalue()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.loaded = torch.load(io.BytesIO(state_dict["blob"]), weights_only=True)


class DeferredRng(RngState):
    """This rank's generators, put back once the framework has done its own seeding.

    Both frameworks seed at start (Lightning's ``reset_seed`` in its process-group set-up,
    the Trainer's ``set_seed``), which would overwrite generators restored before the fit.
    """

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict

    def apply(self) -> None:
        if self._pending is not None:
            super().load_state_dict(self._pending)
            self._pending = None


class GuardedOptimizer:
    """The framework's ``optimizer.step(closure)`` as closure, then ``guard.step(loss)``."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        guard: Guard,
        *,
        loss_of: Callable[[Callable[[], Any] | None], torch.Tensor],
        before_step: Callable[[], None],
    ) -> None:
        self.optimizer = optimizer
        self.guard = guard
        self._loss_of = loss_of
        self._before_step = before_step
        self._original = optimizer.step
        self._inside = False
        self.last_verdict: Verdict | None = None

        def step(closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
            return self._step(closure, **kwargs)

        # Keeps the LR scheduler's mark on the step it counts (it warns otherwise).
        functools.update_wrapper(step, self._original)
        optimizer.step = step  # type: ignore[method-assign]

    def _step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        if self._inside:  # the guard's own call: the real update
            return self._original(**kwargs)
        loss = self._loss_of(closure)
        self._before_step()
        self._inside = True
        try:
            self.last_verdict = self.guard.step(loss)
        finally:
            self._inside = False
        return loss

    def uninstall(self) -> None:
        self.optimizer.step = self._original  # type: ignore[method-assign]


def warn(message: str) -> None:
    print(f"stabletrain: {message}", file=sys.stderr, flush=True)
