"""Copying a node's local checkpoint copies to its part on the PFS, durably and verified.

A part is built under a temporary name with kernel-side copies (as `cp` does), every file
is fsynced, the manifest is copied last, the new part is read back and checked against
the manifest, and only then one rename commits it.  A local copy that fails its checksum
is never propagated.

The PFS may go away (a read-only remount, an unmounted volume).  Its root is never
created here: a missing root means "not mounted", and writing into the mount point would
put checkpoints on the wrong disk.  While unavailable, copies wait in the pending set and
saves carry on locally; every later attempt retries them, oldest first, so replication
catches up when the PFS returns.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stabletrain_agent.checkpoint.atomic import (
    copy_file_read_back,
    copy_file_synced,
    fsync_dir,
    make_dirs_durable,
    quarantine,
    remove_empty_dirs,
)
from stabletrain_agent.checkpoint.fence import StaleAttemptError, check_not_stale
from stabletrain_agent.checkpoint.inventory_scan import VerifyCache
from stabletrain_agent.checkpoint.layout import (
    MANIFEST_NAME,
    TEMP_PREFIX,
    attempt_dir,
    local_copy_dir,
    pfs_part_dir,
)
from stabletrain_agent.checkpoint.manifest import CheckpointCorruptError, verify_copy
from stabletrain_agent.checkpoint.priority import lower_current_thread_priority
from stabletrain_agent.checkpoint.signing import CheckpointKey


class PfsUnavailableError(Exception):
    """The PFS tier cannot be written right now; the message says what failed."""


def replicate_copy(
    local_root: Path,
    pfs_root: Path,
    step: int,
    attempt: int,
    node: str,
    *,
    key: CheckpointKey,
    cache: VerifyCache | None = None,
) -> int:
    """Copy one committed local copy to the PFS; return the bytes copied (0 if already there).

    Raises CheckpointCorruptError if the local copy does not verify under the job's `key`
    (nothing is written) and PfsUnavailableError if the PFS cannot be written.
    """
    source = local_copy_dir(local_root, step, attempt)
    manifest = verify_copy(source, step=step, attempt=attempt, key=key, node=node, deep=False)
    target = pfs_part_dir(pfs_root, step, attempt, node)
    if not pfs_root.is_dir():
        raise PfsUnavailableError(f"PFS root {pfs_root} is not there (not mounted?)")
    try:
        check_not_stale(pfs_root, attempt)
        if target.is_dir():
            verify_copy(target, step=step, attempt=attempt, key=key, node=node)
            return 0
        parent = attempt_dir(pfs_root, step, attempt)
        make_dirs_durable(parent, stop_at=pfs_root)
        temp = parent / f"{TEMP_PREFIX}node-{node}-{uuid.uuid4().hex}"
        temp.mkdir()
    except CheckpointCorruptError:
        quarantine(target)  # a damaged part on the PFS: set aside, then copy afresh
        return replicate_copy(local_root, pfs_root, step, attempt, node, key=key, cache=cache)
    except OSError as error:
        raise PfsUnavailableError(f"cannot write to PFS {pfs_root}: {error}") from error
    copied = 0
    try:
        read_back = {}
        for name in sorted(manifest.files):
            size, read_back[name] = copy_file_read_back(source / name, temp / name)
            copied += size
        copy_file_synced(source / MANIFEST_NAME, temp / MANIFEST_NAME)
        fsync_dir(temp)
        _verify_new_part(temp, source, read_back, step=step, attempt=attempt, key=key, node=node)
        check_not_stale(pfs_root, attempt)
        try:
            os.rename(temp, target)
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(temp, ignore_errors=True)  # another writer committed it first
            verify_copy(target, step=step, attempt=attempt, key=key, node=node)
            return 0
        fsync_dir(parent)
        if cache is not None:
            cache.remember(target, manifest)  # just read back and verified
    except CheckpointCorruptError:
        _discard(temp)
        raise
    except OSError as error:
        _discard(temp)
        if not source.is_dir():
            raise FileNotFoundError(f"local copy {source} was deleted while copying") from error
        raise PfsUnavailableError(f"cannot write to PFS {pfs_root}: {error}") from error
    except BaseException:
        _discard(temp)
        raise
    return copied


def _discard(temp: Path) -> None:
    """Remove a part that was not committed, and the attempt and step directories made for
    it if nothing else is in them: a copy dropped (its local copy deleted by retention
    meanwhile) or failed must leave no empty step on the PFS, where every scan would list
    it and no retention would ever remove it."""
    shutil.rmtree(temp, ignore_errors=True)
    remove_empty_dirs(temp.parent, temp.parent.parent)


def _verify_new_part(
    temp: Path,
    source: Path,
    read_back: dict[str, str],
    *,
    step: int,
    attempt: int,
    key: CheckpointKey,
    node: str,
) -> None:
    """Check the new part (manifest and sizes on disk, checksums as read back) before commit.

    If it does not verify, the local copy decides whose fault it is: a damaged local copy
    is never propagated (CheckpointCorruptError); a good one means the PFS mangled the
    copy, which is treated like an unavailable PFS and retried later.
    """
    try:
        manifest = verify_copy(temp, step=step, attempt=attempt, key=key, node=node, deep=False)
        for name, entry in sorted(manifest.files.items()):
            if read_back.get(name) != entry.crc32:
                raise CheckpointCorruptError(temp, f"file {name!r} fails its crc32 check")
    except CheckpointCorruptError as copy_error:
        verify_copy(source, step=step, attempt=attempt, key=key, node=node)
        raise PfsUnavailableError(f"copy on the PFS does not verify: {copy_error}") from None


@dataclass
class PfsCondition:
    """Whether the PFS took the last write; exported as a status condition and a metric."""

    available: bool = True
    message: str = "PFS tier is writable"
    since: float = field(default_factory=time.time)


@dataclass(frozen=True)
class FlushResult:
    replicated: tuple[int, ...]
    pending: tuple[int, ...]
    timed_out: bool


class Replicator:
    """A background thread that replicates this node's committed copies to the PFS."""

    def __init__(
        self,
        local_root: Path,
        pfs_root: Path,
        node: str,
        *,
        key: CheckpointKey,
        retry_interval_s: float = 5.0,
        on_error: Callable[[str], None] | None = None,
        cache: VerifyCache | None = None,
        on_landed: Callable[[], None] | None = None,
    ) -> None:
        self._cache = cache
        self._key = key
        self.local_root = local_root
        self.pfs_root = pfs_root
        self.node = node
        self.retry_interval_s = retry_interval_s
        self._on_error = on_error
        self._on_landed = on_landed
        """Called (outside the lock) after each copy reached the PFS: the PFS is trimmed to
        its retention when a copy lands, not only at the next save."""
        self._lock = threading.Condition()
        self._pending: set[tuple[int, int]] = set()
        self._done: set[tuple[int, int]] = set()
        self._busy: tuple[int, int] | None = None
        self._stopping = False
        self.condition = PfsCondition()
        self.bytes_copied = 0
        self.changes = 0
        """Grows with every copy that reached the PFS or was given up and every change of
        `condition`: the agent re-exports the inventory only when it moved."""
        self._thread = threading.Thread(
            target=self._run, name="stabletrain-replicator", daemon=True
        )
        self._thread.start()

    def submit(self, step: int, attempt: int) -> None:
        with self._lock:
            if (step, attempt) not in self._done:
                self._pending.add((step, attempt))
                self._lock.notify_all()

    def forget(self, step: int, attempt: int) -> None:
        """Retention deleted the local copy: nothing left to replicate."""
        with self._lock:
            self._pending.discard((step, attempt))

    def in_flight(self) -> tuple[int, int] | None:
        """The copy being written to the PFS right now, if any."""
        with self._lock:
            return self._busy

    def pending(self) -> list[tuple[int, int]]:
        with self._lock:
            busy = {self._busy} if self._busy else set()
            return sorted(self._pending | busy)

    def flush(self, deadline_s: float, before_step: int | None = None) -> FlushResult:
        """Wait until every pending copy (with step < before_step, if given) is on the PFS."""
        end = time.monotonic() + deadline_s

        def relevant() -> list[tuple[int, int]]:
            keys = self._pending | ({self._busy} if self._busy else set())
            return sorted(k for k in keys if before_step is None or k[0] < before_step)

        with self._lock:
            self._lock.notify_all()
            while relevant() and (remaining := end - time.monotonic()) > 0:
                self._lock.wait(timeout=min(remaining, 0.05))
            waiting = relevant()
            done = sorted(k for k in self._done if before_step is None or k[0] < before_step)
        return FlushResult(
            replicated=tuple(step for step, _ in done),
            pending=tuple(step for step, _ in waiting),
            timed_out=bool(waiting),
        )

    def close(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        lower_current_thread_priority()
        while True:
            with self._lock:
                while not self._stopping and not self._pending:
                    self._lock.wait()
                if self._stopping:
                    return
                key = min(self._pending)
                self._pending.discard(key)
                self._busy = key
            outcome = self._replicate_one(key)
            if outcome == "done" and self._on_landed is not None:
                self._landed()  # still busy: a flush returns only after the trim
            with self._lock:
                self._busy = None
                if outcome == "done":
                    self._done.add(key)
                    self.changes += 1
                elif outcome == "dropped":
                    self.changes += 1  # no longer on its way: the status says so
                elif outcome == "retry":
                    self._pending.add(key)
                self._lock.notify_all()
                if outcome == "retry" and not self._stopping:
                    self._lock.wait(timeout=self.retry_interval_s)

    def _landed(self) -> None:
        assert self._on_landed is not None
        try:
            self._on_landed()
        except Exception as error:  # the thread must survive anything a disk can throw
            self._report(f"after replication: {error!r}")

    def _replicate_one(self, key: tuple[int, int]) -> str:
        step, attempt = key
        try:
            copied = replicate_copy(
                self.local_root,
                self.pfs_root,
                step,
                attempt,
                self.node,
                key=self._key,
                cache=self._cache,
            )
        except PfsUnavailableError as error:
            self._set_condition(False, str(error))
            return "retry"
        except (CheckpointCorruptError, StaleAttemptError) as error:
            self._report(f"not replicating step {step}: {error}")
            return "dropped"
        except FileNotFoundError:
            return "dropped"  # retention removed the local copy meanwhile
        except Exception as error:  # the thread must survive anything a disk can throw
            self._report(f"replication of step {step} failed: {error!r}")
            return "retry"
        self.bytes_copied += copied
        self._set_condition(True, "PFS tier is writable")
        return "done"

    def _set_condition(self, available: bool, message: str) -> None:
        if available != self.condition.available:
            self.condition = PfsCondition(available, message)
            self.changes += 1
            if not available:
                self._report(message)
        elif not available:
            if message != self.condition.message:
                self.changes += 1
            self.condition = PfsCondition(available, message, self.condition.since)

    def _report(self, message: str) -> None:
        if self._on_error is not None:
            self._on_error(message)
