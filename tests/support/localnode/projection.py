"""Writes a set of files into a volume directory so a reader never sees half an update.

This is the kubelet's atomic-writer layout: the files live in a timestamped directory, a
`..data` symlink is swapped to the new directory with one rename, and each visible name is a
symlink through `..data`. A container watching a ConfigMap volume therefore sees either the
old set of files or the new one.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

DATA_LINK = "..data"

Files = dict[str, tuple[bytes, int]]
"""Relative path -> (content, mode)."""


def _check_relative(path: str) -> None:
    parts = Path(path).parts
    if not parts or Path(path).is_absolute() or ".." in parts or parts[0].startswith(".."):
        raise ValueError(f"volume item path {path!r} must be relative and must not contain '..'")


def current_files(directory: Path) -> Files:
    """What the directory holds now (empty when never written)."""
    data = directory / DATA_LINK
    if not data.exists():
        return {}
    found: Files = {}
    for path in data.resolve().rglob("*"):
        if path.is_file():
            relative = str(path.relative_to(data.resolve()))
            found[relative] = (path.read_bytes(), path.stat().st_mode & 0o7777)
    return found


def write_files(directory: Path, files: Files) -> bool:
    """Makes the directory hold exactly these files; False when it already did."""
    for relative in files:
        _check_relative(relative)
    if current_files(directory) == files and (directory / DATA_LINK).exists():
        return False
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    stamp.mkdir()
    for relative, (content, mode) in files.items():
        target = stamp / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)
    old = (directory / DATA_LINK).resolve() if (directory / DATA_LINK).exists() else None
    staging = directory / "..data_tmp"
    staging.unlink(missing_ok=True)
    staging.symlink_to(stamp.name)
    os.replace(staging, directory / DATA_LINK)
    visible = {Path(relative).parts[0] for relative in files}
    for name in visible:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(f"{DATA_LINK}/{name}")
    for entry in directory.iterdir():
        if entry.is_symlink() and not entry.name.startswith("..") and entry.name not in visible:
            entry.unlink()
    if old is not None and old != stamp:
        shutil.rmtree(old, ignore_errors=True)
    return True
