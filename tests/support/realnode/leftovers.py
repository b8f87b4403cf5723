"""The proof that a real node cleans up: after it, the host looks as it did before it.

A snapshot taken before the node starts is compared with the host after it stopped (or
after the next run restored a SIGKILLed one): no process in or of the node's cgroups, no
cgroup, no new mount, no new link, no new nft table, no changed kernel sysctl, no directory
the node created, no state file.

Other test runs share the machine (local nodes add veth links named `stln*` and mounts of
their own), so new mounts count when they lie where the node works and new links when they
carry a name the node gives links (node0, cni0, the bridge plugin's veth*); nft tables and
sysctls are compared whole.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from support.realnode import hoststate

NODE_LINKS = ("node0", "cni0", "veth")
"""Names of the links the node makes (in its namespace; on the host they would be leaks)."""


def _mount_points() -> set[str]:
    return {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def _links() -> set[str]:
    done = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True)
    return {link["ifname"] for link in json.loads(done.stdout or "[]")}


def _nft_tables() -> set[str]:
    done = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True)
    return {line.strip() for line in done.stdout.splitlines() if line.strip()}


@dataclass(frozen=True)
class HostSnapshot:
    mounts: frozenset[str]
    links: frozenset[str]
    nft_tables: frozenset[str]
    sysctls: dict[str, str]
    existing_dirs: frozenset[str]

    @classmethod
    def take(cls) -> HostSnapshot:
        existing = frozenset(d for d in hoststate.SHADOWED_DIRS if Path(d).exists())
        return cls(frozenset(_mount_points()), frozenset(_links()), frozenset(_nft_tables()),
                   hoststate.read_sysctls(), existing)  # fmt: skip


def _processes_in(cgroup: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if f"/{cgroup}" in (entry / "cgroup").read_text():
                    found.append(f"pid {entry.name} ({(entry / 'comm').read_text().strip()})")
    return found


def find_leftovers(before: HostSnapshot, node_id: str, workdir: str) -> list[str]:
    """One line per thing the node left behind; empty when the host is as before."""
    cgroup = hoststate.CGROUP_PREFIX + node_id
    found = [f"{p} is in cgroup {cgroup}" for p in _processes_in(cgroup)]
    found += [f"cgroup {h / cgroup} exists" for h in hoststate.all_hierarchies()
              if (h / cgroup).exists()]  # fmt: skip
    places = (workdir, *hoststate.SHADOWED_DIRS, "/run/netns", "/var/lib/kubelet")
    new_mounts = _mount_points() - before.mounts
    found += [f"mount {m} is new" for m in sorted(new_mounts) if m.startswith(places)]
    new_links = _links() - before.links
    found += [f"link {n} is new" for n in sorted(new_links) if n.startswith(NODE_LINKS)]
    found += [f"nft table {t!r} is new" for t in sorted(_nft_tables() - before.nft_tables)]
    now = hoststate.read_sysctls()
    found += [f"sysctl {k} is {now[k]} (was {v})" for k, v in before.sysctls.items()
              if now[k] != v]  # fmt: skip
    for directory in hoststate.SHADOWED_DIRS:
        if Path(directory).exists() and directory not in before.existing_dirs:
            found.append(f"directory {directory} exists (the node made it)")
    if Path(workdir).exists():
        found.append(f"the node's workdir {workdir} exists")
    if (hoststate.STATE_DIR / f"{node_id}.json").exists():
        found.append(f"state file {hoststate.STATE_DIR / node_id}.json remains")
    return found
