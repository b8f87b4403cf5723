"""The training processes' output: passed through to the container's log, its end kept.

A crash that leaves no termination message is explained by its last lines (a kubelet's
`FallbackToLogsOnError`); with the container outliving the crash, the supervisor keeps
that tail itself and reports it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from typing import IO

CHUNK = 64 * 1024


class Tail:
    """The last `limit` bytes written through it, from any number of threads."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._lock = threading.Lock()

    def add(self, data: bytes) -> None:
        with self._lock:
            self._chunks.append(data)
            self._size += len(data)
            while self._size - len(self._chunks[0]) >= self._limit:
                self._size -= len(self._chunks.popleft())

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()
            self._size = 0

    def text(self) -> str:
        with self._lock:
            data = b"".join(self._chunks)
        return data[-self._limit :].decode("utf-8", errors="replace")


def pump(source: IO[bytes], sink: int, tail: Tail) -> threading.Thread:
    """Copy `source` to the file descriptor `sink` (and `tail`) until it ends, in a thread
    of its own."""

    def run() -> None:
        with source:
            while data := os.read(source.fileno(), CHUNK):
                tail.add(data)
                # A log that is gone (the container ending) loses this; the tail still has it.
                with contextlib.suppress(OSError):
                    while data:
                        data = data[os.write(sink, data) :]

    thread = threading.Thread(target=run, name="output", daemon=True)
    thread.start()
    return thread
