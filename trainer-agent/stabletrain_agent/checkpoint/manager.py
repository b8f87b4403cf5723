"""The checkpoint manager a training script uses: async save to the local tier, replication
to the PFS, snapshots in the pod's memory tier, verified restore, retention, and the
inventory the agent exports.

Sharding across nodes: torch.distributed.checkpoint writes a key held by several ranks only
once per process group.  Saving over the whole world would leave each node's local tier with
only part of the replicated (data-parallel) state, so a node could not restore alone.  The
manager therefore runs DCP over a per-node gloo group: each node's local copy holds all the
state its ranks need, per-rank state (the `rank_state` given, such as the RNG) lives under a
per-rank key, and the node's part on the PFS is a byte copy of its local copy.  A separate
world-wide gloo group is used only to agree on the restore step.  Neither group is the
training group, so checkpoint collectives never interleave with training collectives even
while a save runs in the background.

Identity across relaunches: torchrun's c10d rendezvous hands out global ranks in its own
order, so a relaunched pod may get another global rank than before.  What stays is the pod's
node rank (the operator sets it per pod) and the process's local rank, so per-rank keys and
the node's part (its PFS directory, the owner named in a copy's manifest) use those.  The
Kubernetes node name only says whose local tier holds a copy, in the inventory.

The memory tier (snapshot.py, memory_tier.py) holds the newest state between two local
saves, every `memory_interval_steps`: it survives a restart of the training processes
inside the pod, so a restart that keeps the pods loses less than a snapshot interval. A
restore prefers it, then the local tier, then the PFS, for the step it is asked to load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save
from torch.distributed.checkpoint.storage import WriteResult

from stabletrain_agent.checkpoint.atomic import (
    copy_file_synced,
    fsync_dir,
    make_dirs_durable,
    quarantine,
    remove_empty_dirs,
    remove_tree_durable,
)
from stabletrain_agent.checkpoint.commit import commit_copy
from stabletrain_agent.checkpoint.fence import (
    Fence,
    StaleAttemptError,
    advance_fence,
    check_not_stale,
)
from stabletrain_agent.checkpoint.inventory_scan import (
    CopyCheck,
    TierDirs,
    VerifyCache,
    combined_fence,
    memory_interval_steps,
    scan_local,
    scan_pfs,
    scan_tiers,
)
from stabletrain_agent.checkpoint.layout import (
    TEMP_PREFIX,
    local_copy_dir,
    local_part_root,
    local_temp_dir,
    pfs_part_dir,
    step_dir,
)
from stabletrain_agent.checkpoint.manifest import (
    CheckpointCorruptError,
    CopyManifest,
    read_signed_manifest,
    verify_copy,
)
from stabletrain_agent.checkpoint.priority import lower_current_thread_priority
from stabletrain_agent.checkpoint.replicate import FlushResult, PfsCondition, Replicator
from stabletrain_agent.checkpoint.safe_load import (
    VerifiedReader,
    WeightsOnlyPlanner,
    load_metadata,
)
from stabletrain_agent.checkpoint.signing import UNSIGNED, CheckpointKey
from stabletrain_agent.checkpoint.snapshot import MemorySnapshots, SnapshotOwner
from stabletrain_agent.checkpoint.states import Stateful
from stabletrain_contract import env
from stabletrain_contract.channel import RejectedCopy
from stabletrain_contract.checkpoint.inventory import CheckpointRecord
from stabletrain_contract.checkpoint.retention import (
    MAX_SPIKE_MARKERS,
    MIN_KEEP,
    RetentionItem,
    copies_within,
    plan_deletions,
)
from stabletrain_contract.checkpoint.settings import CheckpointSettings

log = logging.getLogger(__name__)


def _retention_item(
    key: tuple[int, int], manifest: CopyManifest, on_lineage: bool
) -> RetentionItem:
    return RetentionItem(
        key[0], key[1], manifest.stable, manifest.spike_marker, on_lineage, manifest.episode
    )


class _BackgroundWriter(FileSystemWriter):
    """DCP's file writer, run at background priority in the async save's own thread."""

    def write_data(
        self, plan: SavePlan, planner: SavePlanner
    ) -> torch.futures.Future[list[WriteResult]]:
        lower_current_thread_priority()
        return super().write_data(plan, planner)


def _env_int(environ: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class CheckpointConfig:
    """Where the tiers are and what the job's spec says about saving and keeping.

    Under the operator every field comes from the pod's env (`from_env`), so the manager
    saves at spec.checkpoints.intervalSteps and keeps what the spec's retention,
    spikeMarkers and sizeLimit say without the script repeating any of them.
    """

    local_root: Path
    pfs_root: Path
    attempt: int
    node: str
    node_rank: int = 0
    keep_local: int = env.DEFAULT_RETENTION
    """Regular checkpoints kept on this node's local tier (spec.checkpoints.local.retention)."""
    keep_pfs: int = env.DEFAULT_RETENTION
    """Regular checkpoints kept on the PFS (spec.checkpoints.pfs.retention)."""
    max_spike_markers: int = env.DEFAULT_SPIKE_MARKERS
    """Spike markers kept per tier, the earliest of their episode (spikeMarkers)."""
    replication_retry_s: float = 5.0
    interval_steps: int = env.DEFAULT_CHECKPOINT_INTERVAL_STEPS
    """Every multiple of this is a save step (spec.checkpoints.intervalSteps)."""
    local_size_limit_bytes: int | None = None
    """Budget of the local tier (spec.checkpoints.local.sizeLimit): fewer copies, never full."""
    memory_root: Path | None = None
    """The pod's memory tier (spec.checkpoints.memory, an emptyDir of medium Memory); None
    turns it off, as does `memory_interval_steps` 0."""
    memory_interval_steps: int = env.DEFAULT_MEMORY_INTERVAL_STEPS
    """Every multiple of this that is not a save step is a snapshot step
    (spec.checkpoints.memory.intervalSteps)."""
    pod: str = field(default_factory=socket.gethostname)
    """The pod's name: inventories report the memory tier's snapshots under it."""
    key: CheckpointKey = UNSIGNED
    """The job's checkpoint key (signing.py): signs every copy, and only copies it signed
    are loaded; without one, copies are unsigned and only unsigned ones are loaded."""

    def __post_init__(self) -> None:
        if self.keep_local < MIN_KEEP or self.keep_pfs < MIN_KEEP:
            raise ValueError(
                f"keep_local and keep_pfs must be >= {MIN_KEEP}, got "
                f"{self.keep_local} and {self.keep_pfs}"
            )
        if not 0 <= self.max_spike_markers <= MAX_SPIKE_MARKERS:
            raise ValueError(
                f"max_spike_markers must be 0..{MAX_SPIKE_MARKERS}, got {self.max_spike_markers}"
            )
        if self.interval_steps < 1:
            raise ValueError(f"interval_steps must be >= 1, got {self.interval_steps}")
        if self.memory_interval_steps < 0:
            raise ValueError(
                f"memory_interval_steps must be >= 0, got {self.memory_interval_steps}"
            )
        if self.local_size_limit_bytes is not None and self.local_size_limit_bytes < 0:
            raise ValueError(
                f"local_size_limit_bytes must be >= 0, got {self.local_size_limit_bytes}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CheckpointConfig:
        """The tiers, attempt, node, node rank and the spec's checkpoint settings that the
        operator puts into every pod (contract env names); unset settings take the spec's
        defaults."""
        missing = [
            name
            for name in (env.LOCAL_CHECKPOINT_DIR, env.PFS_CHECKPOINT_DIR, env.ATTEMPT)
            if not environ.get(name)
        ]
        if missing:
            raise ValueError(f"checkpointing needs the environment variables {missing}")
        limit = environ.get(env.LOCAL_SIZE_LIMIT_BYTES)
        memory = environ.get(env.MEMORY_CHECKPOINT_DIR)
        return cls(
            local_root=Path(environ[env.LOCAL_CHECKPOINT_DIR]),
            pfs_root=Path(environ[env.PFS_CHECKPOINT_DIR]),
            attempt=int(environ[env.ATTEMPT]),
            node=environ.get(env.NODE_NAME) or os.uname().nodename,
            node_rank=int(environ.get(env.NODE_RANK) or environ.get(env.GROUP_RANK) or "0"),
            keep_local=_env_int(environ, env.LOCAL_RETENTION, env.DEFAULT_RETENTION, MIN_KEEP),
            keep_pfs=_env_int(environ, env.PFS_RETENTION, env.DEFAULT_RETENTION, MIN_KEEP),
            max_spike_markers=_env_int(environ, env.SPIKE_MARKERS, env.DEFAULT_SPIKE_MARKERS, 0),
            interval_steps=_env_int(
                environ, env.CHECKPOINT_INTERVAL_STEPS, env.DEFAULT_CHECKPOINT_INTERVAL_STEPS, 1
            ),
            local_size_limit_bytes=(
                _env_int(environ, env.LOCAL_SIZE_LIMIT_BYTES, 0, 0) if limit else None
            ),
            memory_root=Path(memory) if memory else None,
            memory_interval_steps=memory_interval_steps(environ),
            pod=environ.get(env.POD_NAME) or socket.gethostname(),
            key=CheckpointKey.from_env(environ),
        )

    @property
    def local_dir(self) -> Path:
        """This pod's own part of the local tier (`<local>/node-<node rank>`): another pod of
        the job on the same node, sharing its local volume, never touches it."""
        return local_part_root(self.local_root, self.part)

    @property
    def memory_dir(self) -> Path | None:
        """This pod's part of its memory tier; None when the tier is off."""
        if self.memory_root is None or self.memory_interval_steps == 0:
            return None
        return local_part_root(self.memory_root, self.part)

    @property
    def tiers(self) -> TierDirs:
        """The tier directories and names a torch-free inventory scan needs."""
        return TierDirs(
            self.local_dir, self.pfs_root, self.memory_dir, self.part, self.node, self.pod
        )

    @property
    def part(self) -> str:
        """The name of this pod's part of every checkpoint: its node rank, which a relaunch
        keeps wherever the pod is scheduled (unlike the global rank or the node)."""
        if self.node_rank < 0:
            raise ValueError(f"node rank must be >= 0, got {self.node_rank}")
        return str(self.node_rank)


Source = Literal["memory", "local", "pfs"]
"""The tier a node's ranks loaded from."""


@dataclass(frozen=True)
class RestoreResult:
    step: int
    attempt: int
    source: Source
    rejected: tuple[str, ...] = ()


class RestoreTargetMissingError(RuntimeError):
    """No verified, on-lineage copy of the step the directives name: the attempt must not
    start from any other step (the message says what was found instead)."""

    def __init__(self, step: int, rejected: Sequence[str]) -> None:
        found = f": {'; '.join(rejected)}" if rejected else ": no copy on either tier"
        super().__init__(f"no restorable checkpoint of step {step}{found}")
        self.step = step


@dataclass
class _Save:
    step: int
    meta: dict[str, Any]
    future: Future[Any]
    finisher: threading.Thread | None = None
    error: BaseException | None = None


class CheckpointManager:
    """Save, replicate, restore and report the checkpoints of one training process."""

    def __init__(
        self,
        config: CheckpointConfig,
        app_state: Mapping[str, Stateful],
        rank_state: Mapping[str, Stateful] | None = None,
    ) -> None:
        self.config = config
        self._app_state = dict(app_state)
        self._rank_state = dict(rank_state or {})
        self._distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self._distributed else 0
        self.local_rank = int(os.environ.get(env.LOCAL_RANK) or "0")
        self.world_size = dist.get_world_size() if self._distributed else 1
        self._world_group: dist.ProcessGroup | None = None
        self._node_group: dist.ProcessGroup | None = None
        self._memory_group: dist.ProcessGroup | None = None
        self.nodes: tuple[str, ...] = (config.part,)
        self.node_ranks: tuple[int, ...] = (0,)
        if self._distributed:
            self._make_groups()
        self.is_node_leader = self.rank == min(self.node_ranks)
        self._stager = DefaultStager(StagingOptions(False, False, False, False))
        self._cache = VerifyCache(config.key)
        self._in_flight: _Save | None = None
        self._last_saved_step: int | None = None
        self._started = False
        self._protected: tuple[tuple[int, int], ...] = ()
        self._episode: int | None = None
        """First step of the anomaly episode the markers being saved belong to."""
        self._episode_markers = 0
        self._retention_lock = threading.Lock()
        """Retention runs after a save (finisher thread) and after a copy reached the PFS
        (replicator thread); one at a time."""
        self.last_blocking_s = 0.0
        self.restored_at: datetime | None = None
        """When `restore` returned (a checkpoint loaded, or none to load): the attempt's
        training begins here, and the heartbeat's start-up bound counts from it."""
        self._changes = 0
        self.replicator: Replicator | None = None
        self.memory = self._memory_snapshots()
        if self.is_node_leader:
            config.local_dir.mkdir(parents=True, exist_ok=True)
            self.replicator = Replicator(
                config.local_dir,
                config.pfs_root,
                config.part,
                key=config.key,
                retry_interval_s=config.replication_retry_s,
                on_error=log.warning,
                cache=self._cache,
                on_landed=self._trim_pfs_after_landing,
            )

    def _make_groups(self) -> None:
        names: list[str] = [""] * self.world_size
        dist.all_gather_object(names, self.config.part)
        self.nodes = tuple(sorted(set(names), key=int))
        self._world_group = dist.new_group(backend="gloo")
        for node in self.nodes:  # every rank creates every group, in the same order
            ranks = [rank for rank, name in enumerate(names) if name == node]
            group = dist.new_group(ranks=ranks, backend="gloo")
            if node == self.config.part:
                self._node_group = group
                self.node_ranks = tuple(ranks)
        if self.config.memory_dir is None:
            return
        for node in self.nodes:  # the snapshots' own groups, never busy with a local save
            ranks = [rank for rank, name in enumerate(names) if name == node]
            group = dist.new_group(ranks=ranks, backend="gloo")
            if node == self.config.part:
                self._memory_group = group

    def _memory_snapshots(self) -> MemorySnapshots | None:
        memory_dir = self.config.memory_dir
        if memory_dir is None:
            return None
        owner = SnapshotOwner(
            memory_dir,
            self.config.attempt,
            self.config.part,
            self.nodes,
            self.node_ranks,
            self.world_size,
            self.is_node_leader,
        )
        return MemorySnapshots(
            owner,
            group=self._memory_group,
            distributed=self._distributed,
            cache=self._cache,
            writer=lambda temp: _BackgroundWriter(temp, sync_files=False, overwrite=True),
            on_commit=self._count_change,
        )

    def _count_change(self) -> None:
        self._changes += 1

    # ----------------------------------------------------------------- save

    def _state(self) -> dict[str, Stateful]:
        prefix = f"node{self.config.node_rank}.local{self.local_rank}"
        per_rank = {f"{prefix}:{name}": obj for name, obj in self._rank_state.items()}
        return {**self._app_state, **per_rank}

    def is_save_step(self, step: int) -> bool:
        """Whether `step` (optimizer steps done) is one the job saves at: every multiple of
        spec.checkpoints.intervalSteps, so a loop asks instead of repeating the interval."""
        return step > 0 and step % self.config.interval_steps == 0

    def is_snapshot_step(self, step: int) -> bool:
        """Whether `step` is one the memory tier snapshots: every multiple of
        spec.checkpoints.memory.intervalSteps that is not a save step (the local copy holds
        that one), never while the tier is off."""
        interval = self.config.memory_interval_steps
        return (
            self.memory is not None
            and step > 0
            and step % interval == 0
            and not self.is_save_step(step)
        )

    def snapshot(self, step: int, *, stable: bool) -> bool:
        """Keep the state after `step` in the pod's memory tier, if `step` is a snapshot step.

        The training thread only stages the state; the write and its commit run in the
        background, and the snapshot replaces the previous one once committed. The guard
        calls this after every healthy step (a step inside an anomaly is not kept: the
        memory tier holds one snapshot, and evidence belongs on the tiers that keep
        markers); a loop without a guard may call it after each step. Every rank makes the
        same calls. Returns whether a snapshot was started.
        """
        if self.memory is None or not self.is_snapshot_step(step):
            return False
        if not self._started:
            raise RuntimeError("call restore() before the first snapshot: it starts the attempt")
        self.memory.take(step, self._state(), stable=stable)
        return True

    def apply_settings(self, settings: CheckpointSettings) -> None:
        """Save and keep what an edited spec says from now on: the guard passes the settings
        of the directives every rank adopts at the same step, so all ranks change their
        save steps together; the next retention pass keeps the new counts. One reference is
        swapped, so the background threads see the old config or the new, never a mix."""
        self.config = dataclasses.replace(
            self.config,
            interval_steps=settings.interval_steps,
            keep_local=settings.keep_local,
            keep_pfs=settings.keep_pfs,
            max_spike_markers=settings.spike_markers,
            local_size_limit_bytes=settings.local_size_limit_bytes,
        )

    def save(
        self,
        step: int,
        *,
        stable: bool,
        spike_marker: bool = False,
        anomalies: Sequence[str] = (),
        baseline: Mapping[str, float] | None = None,
    ) -> bool:
        """Snapshot the state now and write it in the background (one save in flight).

        A spike marker beyond `max_spike_markers` of its episode is not written at all:
        retention keeps the earliest markers of an episode, so a later one would only be
        deleted again.  An episode runs from the first marker to the next regular save.
        Returns whether a save was started; every rank makes the same calls, so every rank
        skips the same ones. A step this attempt saved already is not saved again: the guard
        saves on the operator's request (before a suspend) at a step the loop may save too.
        """
        if not self._started:
            raise RuntimeError("call restore() before the first save: it starts the attempt")
        if step == self._last_saved_step:
            return False
        episode = None
        if spike_marker:
            if self._episode is None:
                self._episode, self._episode_markers = step, 0
            if self._episode_markers >= self.config.max_spike_markers:
                log.info(
                    "spike marker of step %d not saved: episode %d already has %d",
                    step, self._episode, self._episode_markers,
                )  # fmt: skip
                return False
            self._episode_markers += 1
            episode = self._episode
        else:
            self._episode = None
        self._last_saved_step = step
        self.wait()
        check_not_stale(self.config.local_dir, self.config.attempt)
        temp = local_temp_dir(self.config.local_dir, step, self.config.attempt)
        began = time.perf_counter()
        future = async_save(
            self._state(),
            storage_writer=_BackgroundWriter(temp, sync_files=True, overwrite=True),
            process_group=self._node_group,
            async_stager=self._stager,
            no_dist=not self._distributed,
        )
        self.last_blocking_s = time.perf_counter() - began
        meta = {
            "stable": stable,
            "spike_marker": spike_marker,
            "anomalies": tuple(anomalies),
            "episode": episode,
            "baseline": dict(baseline or {}),
        }
        assert isinstance(future, Future)
        save = _Save(step, meta, future)
        save.finisher = threading.Thread(
            target=self._finish, args=(save,), name=f"stabletrain-ckpt-{step}", daemon=True
        )
        save.finisher.start()
        self._in_flight = save
        return True

    def _finish(self, save: _Save) -> None:
        """After the write: the node leader commits the copy and hands it to replication."""
        lower_current_thread_priority()
        try:
            save.future.result()
            if not self.is_node_leader:
                return
            temp = local_temp_dir(self.config.local_dir, save.step, self.config.attempt)
            manifest = commit_copy(
                temp,
                self.config.local_dir,
                key=self.config.key,
                step=save.step,
                attempt=self.config.attempt,
                node=self.config.part,
                nodes=self.nodes,
                ranks=self.node_ranks,
                world_size=self.world_size,
                **save.meta,
            )
            final = local_copy_dir(self.config.local_dir, save.step, self.config.attempt)
            self._cache.remember(final, manifest)
            assert self.replicator is not None
            self.replicator.submit(save.step, self.config.attempt)
            self._apply_retention()
            self._changes += 1
        except BaseException as error:
            save.error = error
            log.error("checkpoint of step %d failed: %s", save.step, error)

    def wait(self) -> None:
        """Block until the in-flight save is committed locally; re-raise its failure."""
        save, self._in_flight = self._in_flight, None
        if save is None:
            return
        assert save.finisher is not None
        save.finisher.join()
        if save.error is not None:
            raise RuntimeError(f"checkpoint of step {save.step} failed") from save.error

    # -------------------------------------------------------------- restore

    def restore(
        self, max_step: int | None = None, *, stable_only: bool = False, exact: bool = False
    ) -> RestoreResult | None:
        """Load the newest restorable checkpoint at or below `max_step` and start the attempt.

        Spike markers are evidence, never restored.  A rollback passes `stable_only` so
        that falling back past a damaged target never lands on a checkpoint saved while
        the run was already unhealthy; a restart after an infrastructure failure takes the
        newest checkpoint whatever its verdict.

        Each node prefers its pod's verified memory snapshot, else its verified local copy,
        else re-seeds its local tier from its verified PFS part; if any node can do none of
        these, every rank moves on to the next older candidate together.  A memory snapshot
        that does not verify (torn) is dropped and never loaded.  None means nothing
        restorable exists: the run starts fresh from step 0.

        `exact` (what the operator's directives ask for) loads `max_step` itself or raises
        RestoreTargetMissingError on every rank: a fallback to another step would be a decision
        the operator did not take.  `max_step=0` with `exact` restores nothing.
        """
        if exact and max_step is None:
            raise ValueError("an exact restore needs the step to restore")
        problems: dict[tuple[int, int], list[str]] = {}
        candidates = self._candidates(max_step, stable_only, problems)
        if exact:
            candidates = [key for key in candidates if key[0] == max_step]
        rejected = [
            problem
            for key in sorted(problems, reverse=True)
            if max_step is None or (key[0] == max_step if exact else key[0] <= max_step)
            for problem in problems[key]
        ]
        for step, attempt in candidates:
            source = self._prepare_copy(step, attempt, rejected) if self.is_node_leader else None
            if not self._all_ranks_agree(source is not None or not self.is_node_leader):
                continue
            node_source = self._node_source(source)
            self._load(self._copy_dir(node_source, step, attempt))
            self._protected = ((step, attempt),)
            self._begin(step)
            return RestoreResult(step, attempt, node_source, tuple(rejected))
        if exact and max_step:
            raise RestoreTargetMissingError(max_step, tuple(rejected))
        self._begin(0)
        return None

    def _candidates(
        self,
        max_step: int | None,
        stable_only: bool,
        problems: dict[tuple[int, int], list[str]],
    ) -> list[tuple[int, int]]:
        """Every (step, attempt) any node can see, judged against every node's fence.

        Nodes see different tiers (a wiped local disk, a PFS that one node cannot reach),
        so both the keys and the recorded attempt starts are pooled before filtering: a
        checkpoint one node knows to be abandoned is abandoned for all.
        """
        fence = combined_fence(self.config.tiers.roots)
        manifests = self._known_manifests(problems)
        keys = {
            key
            for key, manifest in manifests.items()
            if not manifest.spike_marker and (manifest.stable or not stable_only)
        }
        if self._distributed:
            mine = (keys, fence.starts)
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, mine, group=self._world_group)
            keys = set().union(*(theirs for theirs, _ in gathered))
            starts = {start.attempt: start for _, seen in gathered for start in seen}
            fence = Fence(starts=tuple(starts[a] for a in sorted(starts)))
        return sorted(
            (
                key
                for key in keys
                if fence.on_lineage(*key) and (max_step is None or key[0] <= max_step)
            ),
            reverse=True,
        )

    def _known_manifests(
        self, problems: dict[tuple[int, int], list[str]]
    ) -> dict[tuple[int, int], CopyManifest]:
        """A verified manifest for every checkpoint this node can see on either tier; the
        problems of copies that do not verify are collected for the restore report."""
        found: dict[tuple[int, int], CopyManifest] = {}
        part_name = self.config.part
        with contextlib.suppress(OSError):
            for key, pfs_check in scan_pfs(self.config.pfs_root, self._cache).items():
                part = pfs_check.parts.get(part_name)
                if part is not None and part.manifest is not None:
                    found[key] = part.manifest
                elif part is not None and part.problem is not None:
                    path = pfs_part_dir(self.config.pfs_root, *key, part_name)
                    problems.setdefault(key, []).append(self._refusal(path, part))
        tiers = [self.config.local_dir]
        if self.config.memory_dir is not None:
            tiers.insert(0, self.config.memory_dir)
        for tier in tiers:
            for key, check in scan_local(tier, part_name, self._cache).items():
                if check.manifest is not None:
                    found[key] = check.manifest
                elif check.problem is not None:
                    # the refused copy of this tier: a torn snapshot must never cost the
                    # local copy of the same step (it was moved aside in its place)
                    path = local_copy_dir(tier, *key)
                    if tier == self.config.memory_dir:
                        problem = self._drop_snapshot(path, check.problem or "")
                    else:
                        problem = self._refusal(path, check)
                    problems.setdefault(key, []).append(problem)
        return found

    def _drop_snapshot(self, path: Path, problem: object) -> str:
        """A memory snapshot that does not verify is dropped by the node leader, not kept
        aside: the pod's memory is the training's to spend, and the bytes would only
        mislead. The restore report's line for it."""
        if self.is_node_leader:
            remove_tree_durable(path)
            log.error("memory snapshot rejected: %s; dropped", problem)
        return f"memory snapshot: {problem} (dropped)"

    def _refusal(self, path: Path, check: CopyCheck) -> str:
        """The restore report's line for a copy of this node that did not pass its check:
        the node leader moves a refused one aside (never loaded, kept for forensics)."""
        if check.refused is None or not self.is_node_leader:
            return check.problem or ""
        return self._set_aside(path, check.refused)

    def _prepare_copy(self, step: int, attempt: int, rejected: list[str]) -> Source | None:
        if self._memory_copy_verifies(step, attempt, rejected):
            return "memory"
        key, part_name = self.config.key, self.config.part
        local = local_copy_dir(self.config.local_dir, step, attempt)
        if local.is_dir():
            try:
                load_metadata(
                    local, verify_copy(local, step=step, attempt=attempt, key=key, node=part_name)
                )
                return "local"
            except CheckpointCorruptError as error:
                rejected.append(self._set_aside(error.path, error.problem))
        part = pfs_part_dir(self.config.pfs_root, step, attempt, part_name)
        try:
            load_metadata(
                part, verify_copy(part, step=step, attempt=attempt, key=key, node=part_name)
            )
            self._reseed(part, step, attempt)
            return "pfs"
        except CheckpointCorruptError as error:
            rejected.append(
                f"PFS part of step {step}: {self._set_aside(error.path, error.problem)}"
            )
        except OSError as error:
            rejected.append(f"PFS part of step {step}: {error}")
        return None

    def _set_aside(self, path: Path, problem: str) -> str:
        """Quarantine a copy a restore refused and report it (AgentStatus.rejected); the
        restore report's line for it."""
        refused = CheckpointCorruptError(path, problem)
        try:
            moved = quarantine(path)
        except OSError as error:  # a read-only PFS: refused all the same, left in place
            self._cache.refused(path, problem)
            log.error("%s; cannot move it aside: %s", refused, error)
            return f"{refused} (left in place: {error})"
        self._cache.refused(path, problem, quarantined_as=moved)
        log.error("%s; kept as %s", refused, moved)
        return f"{refused} (moved to {moved.name})"

    def _memory_copy_verifies(self, step: int, attempt: int, rejected: list[str]) -> bool:
        """The pod's snapshot of the step, re-read in full; one that does not verify is
        dropped (memory is the pod's to spend, and the bytes would only mislead)."""
        memory_dir = self.config.memory_dir
        if memory_dir is None:
            return False
        snapshot = local_copy_dir(memory_dir, step, attempt)
        if not snapshot.is_dir():
            return False
        try:
            manifest = verify_copy(
                snapshot, step=step, attempt=attempt, key=self.config.key, node=self.config.part
            )
            load_metadata(snapshot, manifest)
            return True
        except CheckpointCorruptError as error:
            rejected.append(self._drop_snapshot(snapshot, error))
            return False

    def _copy_dir(self, source: Source, step: int, attempt: int) -> Path:
        """Where a node's ranks load from: its memory snapshot, or its local copy (a PFS
        part was re-seeded into the local tier first)."""
        if source == "memory":
            assert self.config.memory_dir is not None
            return local_copy_dir(self.config.memory_dir, step, attempt)
        return local_copy_dir(self.config.local_dir, step, attempt)

    def _reseed(self, part: Path, step: int, attempt: int) -> None:
        """Copy the node's PFS part to its local tier under a temp name, verify, rename."""
        parent = step_dir(self.config.local_dir, step)
        make_dirs_durable(parent, stop_at=self.config.local_dir)
        temp = parent / f"{TEMP_PREFIX}reseed-{uuid.uuid4().hex}"
        temp.mkdir()
        try:
            for source in sorted(part.iterdir()):
                copy_file_synced(source, temp / source.name)
            fsync_dir(temp)
            verify_copy(
                temp, step=step, attempt=attempt, key=self.config.key, node=self.config.part
            )
            os.rename(temp, local_copy_dir(self.config.local_dir, step, attempt))
            fsync_dir(parent)
        finally:
            shutil.rmtree(temp, ignore_errors=True)

    def _all_ranks_agree(self, ok: bool) -> bool:
        if not self._distributed:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._world_group)
        return bool(flag.item())

    def _node_source(self, source: Source | None) -> Source:
        """Every rank learns the copy its node leader chose: the node's ranks load it."""
        if not self._distributed:
            assert source is not None
            return source
        sources: list[Source | None] = [None] * self.world_size
        dist.all_gather_object(sources, source, group=self._world_group)
        chosen = sources[min(self.node_ranks)]
        assert chosen is not None
        return chosen

    def _load(self, directory: Path) -> None:
        """Load a verified copy: its manifest checked again (it may have been swapped since),
        and nothing unpickled beyond what safe_load.py allows."""
        manifest = read_signed_manifest(directory, self.config.key)
        dcp_load(
            self._state(),
            storage_reader=VerifiedReader(directory, manifest),
            planner=WeightsOnlyPlanner(),
            process_group=self._node_group,
            no_dist=not self._distributed,
        )

    def _begin(self, resume_step: int) -> None:
        """Record this attempt's start in the fences: from now on older attempts are fenced.

        Also stage the state once: the stager keeps its CPU buffers per tensor, so the
        allocation happens here and not inside the first save's blocking time. Then the
        restore is over: `restored_at` is stamped.
        """
        if self.is_node_leader:
            advance_fence(self.config.local_dir, self.config.attempt, resume_step)
            self._sweep_partial_saves()
            self._resubmit_unreplicated()
            try:
                if self.config.pfs_root.is_dir():
                    advance_fence(self.config.pfs_root, self.config.attempt, resume_step)
            except OSError as error:
                log.warning("cannot record attempt start on the PFS: %s", error)
        self._stager.stage({name: obj.state_dict() for name, obj in self._state().items()})
        if self.memory is not None:
            self.memory.start_attempt(resume_step, self._state())
        self.restored_at = datetime.now(UTC)
        self._started = True
        self._changes += 1

    def _sweep_partial_saves(self) -> None:
        """Remove what killed writers left under temporary names on this node's tiers.

        Runs when the attempt starts, before this node writes anything, so every temporary
        directory on the local tier belongs to a dead process; on the PFS only this node's
        own replication leftovers are touched (other nodes may be replicating right now).
        """
        for step_path in self.config.local_dir.glob("step-*"):
            for leftover in step_path.glob(f"{TEMP_PREFIX}*"):
                shutil.rmtree(leftover, ignore_errors=True)
        with contextlib.suppress(OSError):
            for pattern in (
                f"step-*/attempt-*/{TEMP_PREFIX}node-{self.config.part}-*",
                f"step-*/attempt-*/{TEMP_PREFIX}trash-node-{self.config.part}-*",
            ):
                for leftover in self.config.pfs_root.glob(pattern):
                    shutil.rmtree(leftover, ignore_errors=True)

    def _resubmit_unreplicated(self) -> None:
        """Queue this node's on-lineage local copies: a previous process may have died
        before replicating them, and the replicator skips those already on the PFS."""
        if self.replicator is None:
            return
        fence = combined_fence([self.config.local_dir, self.config.pfs_root])
        for (step, attempt), check in scan_local(
            self.config.local_dir, self.config.part, self._cache
        ).items():
            if check.ok and fence.on_lineage(step, attempt):
                self.replicator.submit(step, attempt)

    # ----------------------------------------------------- inventory, flush

    def inventory(self) -> list[CheckpointRecord]:
        """This pod's view: its memory tier, its node's local tier and the PFS (the run's
        completeness per step).

        Local copies are reported under the Kubernetes node's name (whose disk holds them),
        and only those of this pod's part: another pod's leftover is no rollback source.
        Memory snapshots are reported under the pod's name (they are gone with the pod).
        """
        return scan_tiers(self.config.tiers, self._cache)

    def rejected(self) -> tuple[RejectedCopy, ...]:
        """Copies this process refused (scans and restores), newest last, for the status."""
        return self._cache.rejected()

    @property
    def inventory_version(self) -> int:
        """Grows whenever what `inventory()` reports may have changed on this node: the
        attempt started, a save committed (and retention ran), a copy reached the PFS, the
        PFS condition changed.  Reading it costs no I/O, so a caller can poll it every step
        and scan only when it moved."""
        return self._changes + (self.replicator.changes if self.replicator else 0)

    @property
    def background_busy(self) -> bool:
        """A save is being written or a copy replicated: step-time dips now are not news."""
        save = self._in_flight
        writing = save is not None and save.finisher is not None and save.finisher.is_alive()
        snapshotting = self.memory is not None and self.memory.busy
        return writing or snapshotting or bool(self.replicator and self.replicator.pending())

    @property
    def pfs_condition(self) -> PfsCondition:
        return self.replicator.condition if self.replicator else PfsCondition()

    @property
    def replicating(self) -> tuple[int, ...] | None:
        """Steps still to be written to the PFS, oldest first (None: no PFS)."""
        if self.replicator is None:
            return None
        return tuple(step for step, _ in self.replicator.pending())

    def flush(self, deadline_s: float, before_step: int | None = None) -> FlushResult:
        """On a trip: finish the save and the snapshot in flight and replicate copies older
        than the onset."""
        end = time.monotonic() + deadline_s
        save = self._in_flight
        if save is not None and save.finisher is not None:
            save.finisher.join(timeout=max(0.0, end - time.monotonic()))
        if self.memory is not None:
            self.memory.wait(timeout=max(0.0, end - time.monotonic()))
        if self.replicator is None:
            return FlushResult((), (), False)
        return self.replicator.flush(max(0.0, end - time.monotonic()), before_step)

    # ------------------------------------------------------------ retention

    def _apply_retention(self) -> None:
        """Node leader: trim this node's local copies and its own parts on the PFS.

        The checkpoint this attempt restored from is protected: it is the rollback target
        the operator chose, and the only one known good before this attempt's saves.  The
        newest copies still waiting for the PFS are kept while it is reachable; while it is
        down, local space wins and only the newest copies wait for it to return.  With a
        size limit the local tier keeps only as many copies as fit next to the one being
        written (never fewer than 2), dropping markers and older copies first.
        """
        with self._retention_lock:
            self._apply_retention_locked()

    def _trim_pfs_after_landing(self) -> None:
        """A copy just reached the PFS: the tier keeps its retention from now on."""
        with self._retention_lock:
            self._trim_pfs([*self._protected, *self._waiting()])

    def _waiting(self) -> list[tuple[int, int]]:
        """Local copies kept for the PFS, the one to give up last at the end.

        Not on the PFS yet: kept until they are, but no more than `keep_local` of them, so
        a replication slower than the saves cannot fill the local disk.  The copy being
        written to the PFS right now comes on top, whatever the PFS's state: deleting it
        wasted the transfer, and a replication slower than two saves then never landed
        anything, each copy deleted under it by the next saves.
        """
        if self.replicator is None:
            return []
        waiting = []
        if self.replicator.condition.available:
            waiting = self.replicator.pending()[-self.config.keep_local :]
        in_flight = self.replicator.in_flight()
        if in_flight is not None and in_flight not in waiting:
            waiting.append(in_flight)
        return waiting

    def _apply_retention_locked(self) -> None:
        waiting = self._waiting()
        try:
            check_not_stale(self.config.local_dir, self.config.attempt)
        except StaleAttemptError:
            return
        fence = combined_fence([self.config.local_dir, self.config.pfs_root])
        local = scan_local(self.config.local_dir, self.config.part, self._cache)
        manifests = {key: c.manifest for key, c in local.items() if c.manifest is not None}
        items = [_retention_item(key, m, fence.on_lineage(*key)) for key, m in manifests.items()]
        for step, attempt in plan_deletions(
            items,
            keep=self.config.keep_local,
            max_spike_markers=self.config.max_spike_markers,
            protected=self._protected,
            waiting=waiting,
            unreplicated=None if self.replicator is None else self.replicator.pending(),
            max_copies=self._local_budget(manifests.values()),
        ):
            if self.replicator is not None:
                self.replicator.forget(step, attempt)
            copy = local_copy_dir(self.config.local_dir, step, attempt)
            remove_tree_durable(copy)
            remove_empty_dirs(copy.parent)
        self._trim_pfs([*self._protected, *waiting])

    def _local_budget(self, manifests: Iterable[CopyManifest]) -> int | None:
        """Copies the local tier's size limit allows, judged by the largest copy on it."""
        limit = self.config.local_size_limit_bytes
        sizes = [sum(entry.size for entry in m.files.values()) for m in manifests]
        if limit is None or not sizes or max(sizes) == 0:
            return None
        budget = copies_within(limit, max(sizes))
        if budget < MIN_KEEP:
            log.warning(
                "local tier size limit %d B holds %d copies of %d B; keeping %d anyway",
                limit, budget, max(sizes), MIN_KEEP,
            )  # fmt: skip
        return budget

    def _trim_pfs(self, protected: Sequence[tuple[int, int]]) -> None:
        try:
            pfs = scan_pfs(self.config.pfs_root, self._cache)
            check_not_stale(self.config.pfs_root, self.config.attempt)
        except (OSError, StaleAttemptError):
            return
        fence = combined_fence([self.config.pfs_root])
        items = []
        for key, check in pfs.items():
            manifest = check.any_manifest
            if manifest is not None and self.config.part in check.parts:
                items.append(_retention_item(key, manifest, fence.on_lineage(*key)))
        for step, attempt in plan_deletions(
            items,
            keep=self.config.keep_pfs,
            max_spike_markers=self.config.max_spike_markers,
            protected=protected,
        ):
            try:
                part = pfs_part_dir(self.config.pfs_root, step, attempt, self.config.part)
                remove_tree_durable(part)
                remove_empty_dirs(part.parent, part.parent.parent)
            except OSError as error:
                log.warning("cannot trim PFS step %d: %s", step, error)

    def close(self) -> None:
        """Finish the save and the snapshot in flight and stop the replication thread
        (pending copies wait)."""
        try:
            self.wait()
        finally:
            if self.memory is not None:
                self.memory.wait()
            if self.replicator is not None:
                self.replicator.close()
