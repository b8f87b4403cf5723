"""Snapshots of the newest training state in the pod's memory tier, taken in the background.

The training thread only stages the state: one copy of each tensor into CPU buffers kept
for the run (allocated when the attempt starts). A thread of the snapshot's own then writes
the copy with torch.distributed.checkpoint to the memory tier, and the pod's node leader
commits it with the manifest every tier uses and drops the previous snapshot
(memory_tier.py). The snapshots have their own buffers and their own per-node gloo group: a
local save may still be writing from its stager's buffers, and its collectives run in its
own thread on its own group, so the two never share a buffer or interleave a collective.

One snapshot is in flight at a time. The next snapshot step waits for the previous one to
finish, on every rank alike: skipping it instead would be a decision each rank takes on its
own, and ranks of one node that disagree would leave the snapshot's collectives hanging.
Writing to memory takes a small part of a snapshot interval, so the wait is normally zero.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import save

from stabletrain_agent.checkpoint.commit import commit_copy
from stabletrain_agent.checkpoint.fence import check_not_stale
from stabletrain_agent.checkpoint.inventory_scan import VerifyCache
from stabletrain_agent.checkpoint.layout import local_copy_dir, local_temp_dir
from stabletrain_agent.checkpoint.memory_tier import keep_only, start_attempt
from stabletrain_agent.checkpoint.priority import lower_current_thread_priority
from stabletrain_agent.checkpoint.states import Stateful

log = logging.getLogger(__name__)


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


class _NotPlainError(Exception):
    """A tensor subclass (DTensor, ShardedTensor) only DCP's own stager knows to copy."""


class CopyIntoBuffers:
    """The state's tensors copied into CPU buffers kept for the run, keyed by their place
    in the state: no allocation after the first snapshot, one `copy_` per tensor.

    DCP's DefaultStager deep-copies the state instead, about 30 us of Python per tensor
    (3.4 ms for the 116 tensors of a 0.9 MB model here, against 0.1 ms of copies): on a
    small model that is a training step per snapshot. Sharded state (tensor subclasses)
    still goes through DefaultStager.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[object, ...], torch.Tensor] = {}
        self._fallback: DefaultStager | None = None

    @torch.no_grad()
    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        try:
            staged: dict[str, Any] = self._copy(state, ())
        except _NotPlainError:
            if self._fallback is None:
                self._fallback = DefaultStager(StagingOptions(False, False, False, False))
            fallback = self._fallback.stage(state)
            assert isinstance(fallback, dict)
            return fallback
        return staged

    def _copy(self, value: Any, place: tuple[object, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            if type(value) not in _PLAIN_TENSORS:
                raise _NotPlainError
            buffer = self._buffers.get(place)
            if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
                buffer = torch.empty(value.shape, dtype=value.dtype, device="cpu")
                self._buffers[place] = buffer
            return buffer.copy_(value)
        if isinstance(value, dict):
            return {key: self._copy(item, (*place, key)) for key, item in value.items()}
        if isinstance(value, list | tuple):
            items = [self._copy(item, (*place, index)) for index, item in enumerate(value)]
            return items if isinstance(value, list) else tuple(items)
        return copy.deepcopy(value)


@dataclass(frozen=True)
class SnapshotOwner:
    """Who writes the snapshots of one pod, as its manifests name them."""

    memory_dir: Path
    attempt: int
    part: str
    nodes: tuple[str, ...]
    ranks: tuple[int, ...]
    world_size: int
    is_node_leader: bool


class MemorySnapshots:
    """The memory tier of one training process: snapshot, commit, keep only the newest."""

    def __init__(
        self,
        owner: SnapshotOwner,
        *,
        group: dist.ProcessGroup | None,
        distributed: bool,
        cache: VerifyCache,
        writer: Callable[[Path], Any],
        on_commit: Callable[[], None],
    ) -> None:
        self.owner = owner
        self._group = group
        self._distributed = distributed
        self._cache = cache
        self._writer = writer
        self._on_commit = on_commit
        self._stager = CopyIntoBuffers()
        self._finisher: threading.Thread | None = None
        self.last_blocking_s = 0.0
        """Time the last snapshot held the training thread (staging and hand-over)."""
        self.committed: tuple[int, int] | None = None
        """(step, attempt) of the newest snapshot this process saw committed."""

    def start_attempt(self, resume_step: int, state: Mapping[str, Stateful]) -> None:
        """Drop what this attempt must never load (node leader), then stage once so the
        staging buffers are allocated now and not inside the first snapshot's step."""
        if self.owner.is_node_leader:
            for dropped in start_attempt(self.owner.memory_dir, self.owner.attempt, resume_step):
                log.info("memory tier: dropped %s", dropped)
        self._stage(state)

    def _stage(self, state: Mapping[str, Stateful]) -> dict[str, Any]:
        return self._stager.stage({name: obj.state_dict() for name, obj in state.items()})

    @property
    def busy(self) -> bool:
        return self._finisher is not None and self._finisher.is_alive()

    def take(self, step: int, state: Mapping[str, Stateful], *, stable: bool) -> None:
        """Stage `state` now and write it to the memory tier in the background."""
        self.wait()
        check_not_stale(self.owner.memory_dir, self.owner.attempt)
        began = time.perf_counter()
        staged = self._stage(state)
        self._finisher = threading.Thread(
            target=self._write,
            args=(step, staged, stable),
            name=f"stabletrain-snapshot-{step}",
            daemon=True,
        )
        self._finisher.start()
        self.last_blocking_s = time.perf_counter() - began

    def _write(self, step: int, staged: dict[str, Any], stable: bool) -> None:
        """Every rank writes its part; the node leader commits the snapshot, then drops the
        previous one. A failed snapshot costs only itself: the local tier and the PFS keep
        the run restorable."""
        lower_current_thread_priority()
        owner = self.owner
        temp = local_temp_dir(owner.memory_dir, step, owner.attempt)
        try:
            save(
                staged,
                storage_writer=self._writer(temp),
                process_group=self._group,
                no_dist=not self._distributed,
            )
            if not owner.is_node_leader:
                return
            manifest = commit_copy(
                temp,
                owner.memory_dir,
                key=self._cache.key,
                step=step,
                attempt=owner.attempt,
                node=owner.part,
                nodes=owner.nodes,
                ranks=owner.ranks,
                world_size=owner.world_size,
                stable=stable,
            )
            self._cache.remember(local_copy_dir(owner.memory_dir, step, owner.attempt), manifest)
            for removed in keep_only(owner.memory_dir, (step, owner.attempt)):
                self._cache.forget(removed)
            self.committed = (step, owner.attempt)
            self._on_commit()
        except Exception as error:
            log.warning("memory snapshot of step %d failed: %s", step, error)

    def wait(self, timeout: float | None = None) -> None:
        """Until the snapshot in flight is committed (or failed), at most `timeout`."""
        finisher = self._finisher
        if finisher is not None:
            finisher.join(timeout)
