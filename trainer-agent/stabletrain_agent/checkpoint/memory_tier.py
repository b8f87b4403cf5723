"""What a pod's memory tier keeps, and what a new attempt drops from it before loading.

The memory tier is an emptyDir of medium Memory: it survives a restart of the training
processes inside the pod and is gone with the pod. Its snapshots use the local tier's
layout and manifests (`<memory>/node-<part>/step-N/attempt-A/`), so one verification rule
covers every tier and a torn snapshot (still under its temporary name, or failing its
checksums) never loads. It counts against the container's memory limit, so it keeps no
history: at most the newest complete snapshot plus the one being written. The history
lives on the local tier and the PFS.

Torch-free: the rules are plain file operations that unit tests run on real directories.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from stabletrain_agent.checkpoint.atomic import remove_tree_durable
from stabletrain_agent.checkpoint.fence import advance_fence
from stabletrain_agent.checkpoint.layout import TEMP_PREFIX, iter_attempt_dirs


def _remove(copy: Path) -> None:
    remove_tree_durable(copy)
    with contextlib.suppress(OSError):
        copy.parent.rmdir()  # the step directory, once empty


def start_attempt(memory_dir: Path, attempt: int, resume_step: int) -> list[str]:
    """Record the attempt's start in the tier's fence, then drop what it must never load.

    Dropped: torn snapshots (a temporary name: the writer died before its commit), every
    snapshot newer than the resume step (it belongs to a lineage this attempt abandoned,
    such as the trajectory before a rollback, whichever attempt wrote it), snapshots an
    earlier attempt's start already put off the lineage, and all but the newest that
    remains. Returns what was dropped, for the log. Run by the pod's node leader before
    the attempt writes anything, so no temporary name belongs to a live writer.
    """
    memory_dir.mkdir(parents=True, exist_ok=True)
    fence = advance_fence(memory_dir, attempt, resume_step)
    dropped: list[str] = []
    for leftover in memory_dir.glob(f"step-*/{TEMP_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)
        dropped.append(f"{leftover.parent.name}/{leftover.name} (torn)")
    kept = []
    for step, written_by, path in iter_attempt_dirs(memory_dir):
        if step > resume_step or not fence.on_lineage(step, written_by):
            _remove(path)
            dropped.append(f"step {step} of attempt {written_by} (another lineage)")
        else:
            kept.append((step, written_by, path))
    for step, written_by, path in kept[:-1]:
        _remove(path)
        dropped.append(f"step {step} of attempt {written_by} (an older snapshot)")
    return dropped


def keep_only(memory_dir: Path, newest: tuple[int, int]) -> list[Path]:
    """After the snapshot `newest` (step, attempt) committed: every other committed snapshot
    goes, so the tier holds one complete snapshot between two snapshot steps. Returns the
    directories removed."""
    removed = []
    for step, attempt, path in iter_attempt_dirs(memory_dir):
        if (step, attempt) != newest:
            _remove(path)
            removed.append(path)
    return removed
