"""The proof that a local cluster cleans up: nothing it created outlives it.

Checks, for what this process created (see registry.py): no process carrying a cluster's
marker, no process (or open descriptor) still in one of its network/UTS/PID namespaces (a network
namespace, its bridge and veths exist exactly as long as that), no host link it made, no mount
in the host's mount table under one of its directories, and no directory it owned.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

from support.localnode.namespaces import MARKER_ENV
from support.localnode.registry import CREATED, Created
from support.localnode.sweep import marked_processes


def _foreign_marker(pid: str, ours: list[str]) -> bool:
    """Another local cluster's process (a concurrent run's): the kernel reuses the inode
    numbers of freed namespaces, so its namespace may carry the number one of ours had."""
    with contextlib.suppress(OSError):
        for variable in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if variable.startswith(f"{MARKER_ENV}=".encode()):
                value = variable.decode(errors="replace").split("=", 1)[1]
                return not any(value.startswith(marker) for marker in ours)
    return False


def _namespace_users(namespaces: set[tuple[str, int]], ours: list[str]) -> list[str]:
    users = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or _foreign_marker(entry.name, ours):
            continue
        with contextlib.suppress(OSError):
            for kind in ("net", "uts", "pid"):
                if (kind, os.stat(entry / "ns" / kind).st_ino) in namespaces:
                    users.append(f"pid {entry.name} is in {kind} namespace")
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                for kind, inode in namespaces:
                    if target == f"{kind}:[{inode}]":
                        users.append(f"pid {entry.name} holds {target} open")
    return users


def _host_links() -> set[str]:
    done = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True)
    return {link["ifname"] for link in json.loads(done.stdout or "[]")}


def find_leftovers(created: Created = CREATED) -> list[str]:
    """One line per thing that should be gone and is not; empty when all is clean."""
    found = []
    for marker in created.markers:
        for pid in marked_processes(marker):
            with contextlib.suppress(OSError):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                found.append(f"process {pid} of {marker}: {command.decode(errors='replace')}")
    found += _namespace_users(set(created.namespaces), created.markers)
    found += [f"host link {name}" for name in set(created.links) & _host_links()]
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    for directory in created.directories:
        found += [f"mount {line}" for line in mounts if str(directory) in line]
        if directory.exists():
            found.append(f"directory {directory}")
    return found


def summary(created: Created = CREATED) -> str:
    return (
        f"{len(created.markers)} local clusters, {len(created.namespaces)} namespaces, "
        f"{len(created.links)} host links, {len(created.directories)} directories"
    )
