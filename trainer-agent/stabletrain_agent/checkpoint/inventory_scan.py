"""What checkpoints exist on this pod's memory tier, its node's local tier and the PFS, and
which can be trusted.

The result uses the contract's `CheckpointRecord`, the form the status endpoint exports
and the trip report compacts.  Deep verification (re-reading every byte) is cached per copy
keyed on the files' sizes and modification times, so frequent scans stay cheap while a
copy that changes on disk is re-read.  The cache also remembers the copies it refused (not
signed with the job's key, damaged): the agent reports them, and the operator names each
in an Event.

Torch-free and given nothing but the tier directories (`TierDirs`): a process in the pod
that outlives the training processes scans with it while they are down, and the pod's
memory tier, which survives their restart, is listed then too.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from stabletrain_agent.checkpoint.fence import Fence, FenceCorruptError, read_fence
from stabletrain_agent.checkpoint.layout import iter_attempt_dirs, local_part_root, parse_node
from stabletrain_agent.checkpoint.manifest import CheckpointCorruptError, CopyManifest, verify_copy
from stabletrain_agent.checkpoint.signing import CheckpointKey
from stabletrain_contract import env
from stabletrain_contract.channel import (
    COPY_PATH_MAX,
    PROBLEM_MAX,
    REJECTED_MAX,
    RejectedCopy,
)
from stabletrain_contract.checkpoint.inventory import (
    CheckpointRecord,
    NodeCopy,
    PodCopy,
    TierCopy,
)


@dataclass(frozen=True)
class CopyCheck:
    """The outcome of checking one copy: the manifest if it verified, else the problem."""

    manifest: CopyManifest | None
    problem: str | None
    refused: str | None = None
    """Why the copy itself is refused (its manifest, signature or files); None when it
    verified, or when the tier could not be read (no verdict on the copy)."""

    @property
    def ok(self) -> bool:
        return self.manifest is not None


def _fingerprint(directory: Path) -> tuple[tuple[str, int, int], ...]:
    entries = []
    for path in sorted(directory.iterdir()):
        stat = path.stat()
        entries.append((path.name, stat.st_size, stat.st_mtime_ns))
    return tuple(entries)


class VerifyCache:
    """Deep verification results under the job's key, valid while a copy's files are
    unchanged on disk; and the copies refused, newest last."""

    def __init__(self, key: CheckpointKey) -> None:
        self.key = key
        self._lock = threading.Lock()
        self._results: dict[Path, tuple[tuple[tuple[str, int, int], ...], CopyCheck]] = {}
        self._refused: dict[Path, RejectedCopy] = {}

    def refused(self, directory: Path, problem: str, quarantined_as: Path | None = None) -> None:
        """Record a copy that did not verify (and where a restore moved it, if it did)."""
        copy = RejectedCopy(
            path=str(directory)[:COPY_PATH_MAX],
            problem=problem[:PROBLEM_MAX],
            quarantined_as=None if quarantined_as is None else str(quarantined_as)[:COPY_PATH_MAX],
        )
        with self._lock:
            self._refused.pop(directory, None)
            self._refused[directory] = copy
            while len(self._refused) > REJECTED_MAX:
                del self._refused[next(iter(self._refused))]

    def rejected(self) -> tuple[RejectedCopy, ...]:
        with self._lock:
            return tuple(self._refused.values())

    def remember(self, directory: Path, manifest: CopyManifest) -> None:
        """Record a copy whose checksums the caller has just computed from what it wrote."""
        with self._lock:
            self._results[directory] = (_fingerprint(directory), CopyCheck(manifest, None))

    def forget(self, directory: Path) -> None:
        """Drop what is known of a copy that was deleted (a snapshot replaced every few
        steps would otherwise leave one entry per snapshot for the run's lifetime)."""
        with self._lock:
            self._results.pop(directory, None)

    def check(
        self, directory: Path, *, step: int, attempt: int, node: str | None = None
    ) -> CopyCheck:
        try:
            fingerprint = _fingerprint(directory)
        except OSError as error:
            return CopyCheck(None, f"cannot list {directory}: {error}")
        with self._lock:
            cached = self._results.get(directory)
        if cached is not None and cached[0] == fingerprint:
            return cached[1]
        try:
            manifest = verify_copy(directory, step=step, attempt=attempt, key=self.key, node=node)
            result = CopyCheck(manifest, None)
        except CheckpointCorruptError as error:
            result = CopyCheck(None, str(error), error.problem)
            self.refused(directory, error.problem)
        except OSError as error:
            result = CopyCheck(None, f"cannot read {directory}: {error}")
        with self._lock:
            self._results[directory] = (fingerprint, result)
        return result


def combined_fence(roots: Iterable[Path]) -> Fence:
    """The union of the attempt starts recorded on every reachable tier."""
    starts = {}
    for root in roots:
        try:
            fence = read_fence(root)
        except (OSError, FenceCorruptError):
            continue
        for start in fence.starts:
            starts[start.attempt] = start
    return Fence(starts=tuple(sorted(starts.values(), key=lambda start: start.attempt)))


def scan_local(local_root: Path, node: str, cache: VerifyCache) -> dict[tuple[int, int], CopyCheck]:
    """Every committed copy on this node's local tier, checked."""
    return {
        (step, attempt): cache.check(path, step=step, attempt=attempt, node=node)
        for step, attempt, path in iter_attempt_dirs(local_root)
    }


@dataclass(frozen=True)
class PfsCheck:
    """A checkpoint on the PFS: complete only if every node of the run has a verified part."""

    parts: dict[str, CopyCheck]
    expected_nodes: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return bool(self.expected_nodes) and all(
            node in self.parts and self.parts[node].ok for node in self.expected_nodes
        )

    @property
    def any_manifest(self) -> CopyManifest | None:
        return next((check.manifest for check in self.parts.values() if check.ok), None)


def scan_pfs(pfs_root: Path, cache: VerifyCache) -> dict[tuple[int, int], PfsCheck]:
    found: dict[tuple[int, int], PfsCheck] = {}
    for step, attempt, path in iter_attempt_dirs(pfs_root):
        parts: dict[str, CopyCheck] = {}
        for part in sorted(path.iterdir()):
            node = parse_node(part.name)
            if node is not None and part.is_dir():
                parts[node] = cache.check(part, step=step, attempt=attempt, node=node)
        manifests = [check.manifest for check in parts.values() if check.manifest is not None]
        expected = manifests[0].nodes if manifests else ()
        if any(manifest.nodes != expected for manifest in manifests):
            expected = ()  # parts disagree about the run's nodes: never complete
        found[(step, attempt)] = PfsCheck(parts, expected)
    return found


def build_records(
    node: str,
    local: dict[tuple[int, int], CopyCheck],
    pfs: dict[tuple[int, int], PfsCheck],
    fence: Fence,
    *,
    memory: dict[tuple[int, int], CopyCheck] | None = None,
    pod: str | None = None,
) -> list[CheckpointRecord]:
    """One record per on-lineage checkpoint that has at least one verified copy somewhere:
    this node's local tier, the PFS, or (`memory`, seen from `pod`) this pod's memory tier."""
    memory = memory or {}
    records: list[CheckpointRecord] = []
    for step, attempt in sorted(set(local) | set(pfs) | set(memory)):
        if not fence.on_lineage(step, attempt):
            continue
        local_check = local.get((step, attempt))
        pfs_check = pfs.get((step, attempt))
        memory_check = memory.get((step, attempt))
        manifest = (
            (local_check.manifest if local_check else None)
            or (pfs_check.any_manifest if pfs_check else None)
            or (memory_check.manifest if memory_check else None)
        )
        if manifest is None:
            continue
        pfs_complete = pfs_check is not None and pfs_check.complete
        local_ok = local_check is not None and local_check.ok
        memory_ok = pod is not None and memory_check is not None and memory_check.ok
        records.append(
            CheckpointRecord(
                step=step,
                attempt=attempt,
                stable=manifest.stable,
                spike_marker=manifest.spike_marker,
                saved_at=datetime.fromtimestamp(manifest.created_at, tz=UTC),
                pfs=TierCopy(complete=pfs_complete, verified=pfs_complete),
                local=(NodeCopy(node=node, complete=True, verified=True),) if local_ok else (),
                memory=(
                    (PodCopy(pod=pod, complete=True, verified=True),)
                    if memory_ok and pod is not None
                    else ()
                ),
            )
        )
    return records


def memory_interval_steps(environ: Mapping[str, str]) -> int:
    """spec.checkpoints.memory.intervalSteps as the pod's env states it (unset: the spec's
    default); 0 means the memory tier is off."""
    raw = environ.get(env.MEMORY_INTERVAL_STEPS) or str(env.DEFAULT_MEMORY_INTERVAL_STEPS)
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{env.MEMORY_INTERVAL_STEPS} must be an integer >= 0, got {raw!r}")
    return value


@dataclass(frozen=True)
class TierDirs:
    """Where one pod's tiers are, and the names its inventory reports them under."""

    local_dir: Path
    """This pod's part of its node's local tier (`<local>/node-<part>`)."""
    pfs_root: Path
    memory_dir: Path | None
    """This pod's part of its memory tier; None when the tier is off."""
    part: str
    """The pod's node rank: whose part of each checkpoint the copies are."""
    node: str
    """The Kubernetes node (local copies are reported under it)."""
    pod: str
    """The pod (memory copies are reported under it)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> TierDirs:
        """The tiers the operator mounts into every pod, from the contract's env names, as
        the checkpoint manager reads them (CheckpointConfig.from_env)."""
        missing = [
            name
            for name in (env.LOCAL_CHECKPOINT_DIR, env.PFS_CHECKPOINT_DIR)
            if not environ.get(name)
        ]
        if missing:
            raise ValueError(f"scanning the checkpoint tiers needs the variables {missing}")
        part = environ.get(env.NODE_RANK) or environ.get(env.GROUP_RANK) or "0"
        memory = environ.get(env.MEMORY_CHECKPOINT_DIR)
        return cls(
            local_dir=local_part_root(Path(environ[env.LOCAL_CHECKPOINT_DIR]), part),
            pfs_root=Path(environ[env.PFS_CHECKPOINT_DIR]),
            memory_dir=(
                local_part_root(Path(memory), part)
                if memory and memory_interval_steps(environ) > 0
                else None
            ),
            part=part,
            node=environ.get(env.NODE_NAME) or os.uname().nodename,
            pod=environ.get(env.POD_NAME) or socket.gethostname(),
        )

    @property
    def roots(self) -> list[Path]:
        """Every tier root that records attempt starts (their fences)."""
        return [self.local_dir, self.pfs_root, *([self.memory_dir] if self.memory_dir else [])]


def scan_tiers(tiers: TierDirs, cache: VerifyCache) -> list[CheckpointRecord]:
    """This pod's inventory: its memory tier, its node's local tier (its own part) and the
    PFS, judged against every tier's fence. An unreachable PFS lists nothing from it."""
    fence = combined_fence(tiers.roots)
    local = scan_local(tiers.local_dir, tiers.part, cache)
    memory = scan_local(tiers.memory_dir, tiers.part, cache) if tiers.memory_dir else {}
    try:
        pfs = scan_pfs(tiers.pfs_root, cache)
    except OSError:
        pfs = {}
    return build_records(tiers.node, local, pfs, fence, memory=memory, pod=tiers.pod)
