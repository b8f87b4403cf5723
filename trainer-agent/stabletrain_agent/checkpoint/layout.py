"""Where every checkpoint file lives, in one place, so writers, scanners and the operator agree.

Local tier (one per node):  <local>/node-<node rank>/step-0000000200/attempt-3/{DCP files,
                            MANIFEST.json}
PFS tier (shared):          <pfs>/step-0000000200/attempt-3/node-<node rank>/{same files}

The local tier is divided by node rank too: two pods of a job can share a node and its
local volume (a hostPath), and their copies of one step must never meet.

The attempt is part of the path so writers of different attempts never touch the same
files: a stale writer from an earlier attempt can only ever produce an earlier-attempt copy,
which the fence's lineage rule then judges on its own.  Names starting with a dot are work in
progress (temporary names before the atomic rename) and are invisible to scanners.
"""

from __future__ import annotations

import re
from pathlib import Path

MANIFEST_NAME = "MANIFEST.json"
FENCE_NAME = "FENCE.json"
TEMP_PREFIX = ".tmp-"

_STEP_RE = re.compile(r"^step-(\d{10})$")
_ATTEMPT_RE = re.compile(r"^attempt-(\d+)$")
_NODE_RE = re.compile(r"^node-(.+)$")
_SAFE_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class LayoutError(ValueError):
    """A name that cannot be used as a path component (it could escape the tier)."""


def check_node_name(node: str) -> str:
    """Node names become directory names, so refuse anything that is not a plain component."""
    if not _SAFE_NODE_RE.match(node):
        raise LayoutError(
            f"node name {node!r} is not usable as a directory name "
            "(letters, digits, '.', '_', '-'; not starting with a dot)"
        )
    return node


def step_dir(root: Path, step: int) -> Path:
    if step < 0:
        raise LayoutError(f"step must be >= 0, got {step}")
    return root / f"step-{step:010d}"


def attempt_dir(root: Path, step: int, attempt: int) -> Path:
    if attempt < 0:
        raise LayoutError(f"attempt must be >= 0, got {attempt}")
    return step_dir(root, step) / f"attempt-{attempt}"


def local_part_root(local_root: Path, node: str) -> Path:
    """One node rank's own directory on the local tier: every local path starts here."""
    return local_root / f"node-{check_node_name(node)}"


def local_copy_dir(local_root: Path, step: int, attempt: int) -> Path:
    """The node's own copy of a checkpoint on its local tier."""
    return attempt_dir(local_root, step, attempt)


def local_temp_dir(local_root: Path, step: int, attempt: int) -> Path:
    """Where a save is written before the rename commits it; shared by the node's ranks."""
    return step_dir(local_root, step) / f"{TEMP_PREFIX}attempt-{attempt}"


def pfs_part_dir(pfs_root: Path, step: int, attempt: int, node: str) -> Path:
    """One node's part of a checkpoint on the PFS."""
    return attempt_dir(pfs_root, step, attempt) / f"node-{check_node_name(node)}"


def parse_step(name: str) -> int | None:
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def parse_attempt(name: str) -> int | None:
    match = _ATTEMPT_RE.match(name)
    return int(match.group(1)) if match else None


def parse_node(name: str) -> str | None:
    match = _NODE_RE.match(name)
    if match is None or not _SAFE_NODE_RE.match(match.group(1)):
        return None
    return match.group(1)


def iter_attempt_dirs(root: Path) -> list[tuple[int, int, Path]]:
    """Every committed (step, attempt, dir) under a tier root, oldest step first."""
    found: list[tuple[int, int, Path]] = []
    if not root.is_dir():
        return found
    for step_path in root.iterdir():
        step = parse_step(step_path.name)
        if step is None or not step_path.is_dir():
            continue
        try:
            attempts = list(step_path.iterdir())
        except FileNotFoundError:
            continue  # retention removed it while we looked
        for attempt_path in attempts:
            attempt = parse_attempt(attempt_path.name)
            if attempt is not None and attempt_path.is_dir():
                found.append((step, attempt, attempt_path))
    found.sort(key=lambda item: (item[0], item[1]))
    return found
