"""Reaching into the real node's network namespace from the test process, which stays outside.

The node's network namespace has no link to the host (nothing in it routes off the machine),
so the test process reaches the API server inside it through a forwarder: a listener on this
host's loopback whose connections are dialled from inside the namespace. A socket belongs to
the namespace of the thread that created it, and setns(2) moves only the calling thread, so a
short-lived thread enters the namespace, creates the socket, and hands it back.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


def call_in_netns(netns: Path, action: Callable[[], T]) -> T:
    """Runs `action` on a thread inside the network namespace `netns` (/proc/PID/ns/net)."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(netns, os.O_RDONLY)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns({netns}): {os.strerror(errno)}")
            finally:
                os.close(fd)
            result.append(action())
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=run, name="netns-call", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class Forwarder:
    """127.0.0.1:<port> on the host -> host:port inside the namespace, both ways."""

    def __init__(self, netns: Path, host: str, port: int, listen_port: int = 0) -> None:
        self._netns = netns
        self._target = (host, port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", listen_port))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="netns-forward", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = call_in_netns(self._netns, lambda: socket.socket(socket.AF_INET))
        with self._lock:
            self._open.update((client, upstream))
        try:
            upstream.connect(self._target)
        except OSError:
            self._close(client, upstream)
            return
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        self._close(client, upstream)

    def _close(self, *sockets: socket.socket) -> None:
        with self._lock:
            for sock in sockets:
                self._open.discard(sock)
                sock.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)
