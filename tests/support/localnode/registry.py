"""What local clusters of this process created, so the end of a session can prove it is gone.

Only this process's own objects are listed: other test runs on the same machine may hold
namespaces, links and processes of their own at the same time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Created:
    markers: list[str] = field(default_factory=list)
    namespaces: list[tuple[str, int]] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    directories: list[Path] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_namespace(self, kind: str, inode: int) -> None:
        with self.lock:
            self.namespaces.append((kind, inode))


CREATED = Created()
