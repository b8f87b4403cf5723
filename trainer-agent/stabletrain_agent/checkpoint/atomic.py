"""Durable file operations: what is renamed into place has reached the disk first.

A rename is only a commit if the renamed data and the directory entry are both on disk, so
every helper fsyncs the file, renames, then fsyncs the directory that holds the new name.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stabletrain_agent.checkpoint.layout import TEMP_PREFIX
from stabletrain_agent.checkpoint.priority import lower_current_thread_priority

# Large enough that syscall overhead vanishes, small enough to stay in the CPU caches' shadow.
COPY_CHUNK_BYTES = 8 << 20
# Ranges copied and checksummed in a pipeline: big enough to amortise the hand-over.
READ_BACK_RANGE_BYTES = 32 << 20


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


def remove_empty_dirs(*directories: Path) -> None:
    """Remove the directories that are empty, in order (one still holding anything, a part
    of another node or a copy being written, is left alone).  An attempt directory with
    nothing in it would otherwise be listed as a checkpoint step by every scan."""
    for directory in directories:
        with contextlib.suppress(OSError):
            directory.rmdir()


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


def crc32_file(path: Path) -> str:
    """CRC-32 of a file's bytes as 8 hex digits (see manifest.py for why CRC-32)."""
    return digest_file(path, sha256=False)[0]


def digest_file(path: Path, *, sha256: bool) -> tuple[str, str | None]:
    """CRC-32 (8 hex digits) and, when asked, SHA-256 (64) of a file, in one read of it."""
    checksum = 0
    digest = hashlib.sha256() if sha256 else None
    buffer = bytearray(COPY_CHUNK_BYTES)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as handle:
        while True:
            count = handle.readinto(view)
            if not count:
                break
            checksum = zlib.crc32(view[:count], checksum)
            if digest is not None:
                digest.update(view[:count])
    return f"{checksum:08x}", None if digest is None else digest.hexdigest()


def _copy_range(src: int, dst: int, offset: int, count: int) -> None:
    """Copy bytes [offset, offset+count) in the kernel, or through a buffer where it cannot."""
    done = 0
    try:
        while done < count:
            moved = os.copy_file_range(src, dst, count - done, offset + done, offset + done)
            if moved == 0:
                raise OSError(errno.EIO, f"source ended early at byte {offset + done}")
            done += moved
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
        while done < count:
            data = os.pread(src, min(COPY_CHUNK_BYTES, count - done), offset + done)
            if not data:
                raise OSError(errno.EIO, f"source ended early at byte {offset + done}") from None
            written = 0
            while written < len(data):
                written += os.pwrite(dst, data[written:], offset + done + written)
            done += len(data)


class _ReadBackChecksum:
    """CRC-32 of a file's bytes, fed range by range in order (from one worker thread)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.value = 0
        self._buffer = bytearray(COPY_CHUNK_BYTES)

    def add(self, offset: int, count: int) -> None:
        lower_current_thread_priority()
        view = memoryview(self._buffer)
        end = offset + count
        while offset < end:
            got = os.preadv(self.fd, [view[: min(len(view), end - offset)]], offset)
            if got == 0:
                raise OSError(errno.EIO, f"copy ended early at byte {offset}")
            self.value = zlib.crc32(view[:got], self.value)
            offset += got


def copy_file_read_back(source: Path, destination: Path) -> tuple[int, str]:
    """Copy a file to a new name, fsync it, and return (bytes, CRC-32 of the copy as read back).

    The copy runs in the kernel (as `cp` does); each range is read back from the new file
    and checksummed in a second thread while the next range is being copied, so verifying
    the copy costs little more than the copy itself.
    """
    with source.open("rb") as src, destination.open("xb+") as dst:
        size = os.fstat(src.fileno()).st_size
        checksum = _ReadBackChecksum(dst.fileno())
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = []
            for offset in range(0, size, READ_BACK_RANGE_BYTES):
                count = min(READ_BACK_RANGE_BYTES, size - offset)
                _copy_range(src.fileno(), dst.fileno(), offset, count)
                pending.append(pool.submit(checksum.add, offset, count))
            os.fsync(dst.fileno())
            for future in pending:
                future.result()
    return size, f"{checksum.value:08x}"


def copy_file_synced(source: Path, destination: Path) -> int:
    """Copy one file to a new name in the kernel (as `cp` does) and fsync it; return bytes."""
    with source.open("rb") as src, destination.open("xb") as dst:
        size = os.fstat(src.fileno()).st_size
        _copy_range(src.fileno(), dst.fileno(), 0, size)
        os.fsync(dst.fileno())
    return size


def quarantine(path: Path) -> Path:
    """Move a copy that does not verify out of the way, keeping its bytes for forensics.

    The new name starts with a dot, so scanners no longer see a checkpoint there and the
    original name is free for a good copy; nothing is deleted on a failed check.
    """
    target = path.with_name(f".corrupt-{path.name}-{uuid.uuid4().hex[:8]}")
    os.rename(path, target)
    fsync_dir(path.parent)
    return target


def remove_tree_durable(path: Path) -> None:
    """Delete a directory so that no crash leaves a partial copy under its real name.

    One rename moves the whole copy to a dot-named trash name (invisible to scanners, swept
    at the next start if the deletion itself is interrupted), then the trash is removed.
    """
    trash = path.with_name(f"{TEMP_PREFIX}trash-{path.name}-{uuid.uuid4().hex}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)
