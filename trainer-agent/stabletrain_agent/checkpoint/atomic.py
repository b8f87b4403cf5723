"""Durable file operations: what is renamed into place has reached the disk first.

A rename is only a commit if the renamed data and the directory entry are both on disk, so
every helper fsyncs the file, renames, then fsyncs the directory that holds the new name.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

from stabletrain_agent.checkpoint.layout import TEMP_PREFIX

# Large enough that syscall overhead vanishes, small enough to stay in the CPU caches' shadow.
COPY_CHUNK_BYTES = 8 << 20


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs_durable(path: Path, stop_at: Path) -> None:
    """mkdir -p, fsyncing each parent whose entry list changed (up to and excluding stop_at)."""
    missing: list[Path] = []
    current = path
    while not current.exists() and current not in (stop_at, current.parent):
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            continue
        fsync_dir(directory.parent)


def write_file_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new content."""
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}.{uuid.uuid4().hex}")
    try:
        with temp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(COPY_CHUNK_BYTES)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as handle:
        while True:
            count = handle.readinto(view)
            if not count:
                break
            digest.update(view[:count])
    return digest.hexdigest()


def copy_file_synced(source: Path, destination: Path) -> tuple[int, str]:
    """Copy one file, fsync it, and return (bytes, sha256 of the bytes written).

    The checksum is taken over the very buffers that were written, in the same pass as the
    copy, so a copy is verified against the source manifest without reading it twice.
    """
    digest = hashlib.sha256()
    buffer = bytearray(COPY_CHUNK_BYTES)
    view = memoryview(buffer)
    total = 0
    with source.open("rb", buffering=0) as src, destination.open("xb", buffering=0) as dst:
        while True:
            count = src.readinto(view)
            if not count:
                break
            chunk = view[:count]
            digest.update(chunk)
            written = 0
            while written < count:
                written += dst.write(chunk[written:])
            total += count
        os.fsync(dst.fileno())
    return total, digest.hexdigest()


def remove_tree_durable(path: Path, first: str | None = None) -> None:
    """Delete a directory so that no crash leaves something that still looks valid.

    `first` (the manifest) is unlinked and made durable before anything else: a copy
    without its manifest does not exist, whatever else survives a crash mid-delete.
    """
    if not path.exists():
        return
    if first is not None:
        marker = path / first
        if marker.exists():
            marker.unlink()
            fsync_dir(path)
    trash = path.with_name(f"{TEMP_PREFIX}trash-{path.name}-{uuid.uuid4().hex}")
    os.rename(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)
