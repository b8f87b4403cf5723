"""The host state a real node changes, recorded before it changes and restored after.

Namespaces contain most of a kubelet's footprint: links, routes, nft/iptables rules and
per-network sysctls live in the node's network namespace, and every mount (overlay rootfs,
volume tmpfs, netns pins, the kubelet root bind) in its private mount namespace; both vanish
with their last process. What no namespace contains is handled here:

- kernel-wide sysctls the kubelet sets at start (vm.overcommit_memory, kernel.panic, ...),
- cgroups: the node's processes (and the kubelet's pod cgroups under its cgroupRoot) live
  in one tree per v1 hierarchy, which also finds every process to stop, container shims
  included (they leave containerd's process group and session, never its cgroup),
- directories that hard-coded paths need on the host (/var/lib/cni, /run/containerd, ...),
  shadowed by a tmpfs inside the mount namespace and removed after if the node created them.

A state file written before the first change lets the next run restore a SIGKILLed one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_DIR = Path("/tmp/stabletrain-realnode")
"""State files and the lock: outside any run's workdir, so a killed run's survive it."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "stabletrain-node-"
KERNEL_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
"""What kubelet's container manager writes (setupKernelTunables) outside any namespace."""
SHADOWED_DIRS = ("/run/containerd", "/var/lib/cni", "/var/log/containers", "/var/log/pods")
"""Paths compiled into containerd, libcni and the kubelet; a tmpfs inside the node's mount
namespace covers each, so nothing lands on the host's disk."""


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    return {name: _sysctl_path(name).read_text().strip() for name in KERNEL_SYSCTLS}


def _cgroup_mounts(kinds: tuple[str, ...]) -> list[Path]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        if fields[separator + 1] in kinds:
            found.append(Path(fields[4]))
    return sorted(set(found))


def v1_hierarchies() -> list[Path]:
    """Mount points of the cgroup v1 hierarchies (one per controller here, plus systemd)."""
    return _cgroup_mounts(("cgroup",))


def all_hierarchies() -> list[Path]:
    """The v1 hierarchies and a hybrid host's cgroup2 one, where runc mirrors the v1 paths."""
    return _cgroup_mounts(("cgroup", "cgroup2"))


@dataclass
class HostState:
    """What one node changed, persisted as JSON in STATE_DIR/<node_id>.json."""

    node_id: str
    owner: int
    workdir: str
    sysctls: dict[str, str]
    created_dirs: list[str] = field(default_factory=list)

    @property
    def cgroup(self) -> str:
        return CGROUP_PREFIX + self.node_id

    @property
    def path(self) -> Path:
        return STATE_DIR / f"{self.node_id}.json"

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(self.path)

    @classmethod
    def load(cls, path: Path) -> HostState:
        return cls(**json.loads(path.read_text()))

    def cgroup_dirs(self) -> list[Path]:
        """The node's cgroup in every hierarchy, the unified one included."""
        return [hierarchy / self.cgroup for hierarchy in all_hierarchies()]


def create_cgroups(state: HostState) -> list[Path]:
    """The node's cgroup in every v1 hierarchy (cpuset needs its cpus and mems copied)."""
    made = []
    for directory in (hierarchy / state.cgroup for hierarchy in v1_hierarchies()):
        directory.mkdir(exist_ok=True)
        made.append(directory)
        if (directory / "cpuset.cpus").exists():
            for name in ("cpuset.cpus", "cpuset.mems"):
                (directory / name).write_text((directory.parent / name).read_text())
    return made


def cgroup_processes(state: HostState) -> set[int]:
    """Every process in the node's cgroup trees."""
    pids: set[int] = set()
    for top in state.cgroup_dirs():
        if not top.exists():
            continue
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(line) for line in procs.read_text().split())
    return pids


def kill_cgroup_processes(state: HostState, timeout: float = 20.0) -> None:
    """SIGKILLs the node's processes until none is left (frozen first, so none forks), then
    waits until they are reaped.

    A killed process leaves its cgroup at once but stays a zombie until its parent reaps it.
    Once its shim is gone that parent is the host's init, which may take seconds (PID 1 here
    reaps orphans about 1.5 s late), so "stopped" means gone from /proc."""
    freezer = CGROUP_ROOT / "freezer" / state.cgroup / "freezer.state"
    deadline = time.monotonic() + timeout
    killed: set[int] = set()
    while pids := cgroup_processes(state):
        killed |= pids
        if freezer.exists():
            with contextlib.suppress(OSError):
                freezer.write_text("FROZEN")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if freezer.exists():
            with contextlib.suppress(OSError):
                freezer.write_text("THAWED")
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes of node {state.node_id} survive SIGKILL: {pids}")
        time.sleep(0.1)
    _wait_reaped(killed, deadline + timeout)


def _wait_reaped(pids: set[int], deadline: float) -> None:
    """Reaps the killed processes that are this process's children; waits for the rest."""
    while True:
        for pid in list(pids):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not Path(f"/proc/{pid}").exists():
                pids.discard(pid)
        if not pids:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"killed processes were never reaped by their parent: {pids}")
        time.sleep(0.1)


def remove_cgroups(state: HostState, timeout: float = 20.0) -> None:
    """Removes the node's cgroup trees, deepest first (a cgroup empties asynchronously)."""
    deadline = time.monotonic() + timeout
    for top in state.cgroup_dirs():
        if not top.exists():
            continue
        children = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
        for directory in [*children, top]:
            while directory.exists():
                try:
                    directory.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)


def restore(state: HostState) -> None:
    """Undoes what the node changed; safe to repeat and to run on a half-started node."""
    kill_cgroup_processes(state)
    remove_cgroups(state)
    for name, value in state.sysctls.items():
        path = _sysctl_path(name)
        if path.read_text().strip() != value:
            path.write_text(value)
    for directory in reversed(state.created_dirs):
        with contextlib.suppress(FileNotFoundError):
            subprocess.run(["rm", "-rf", "--one-file-system", directory], check=True)
    subprocess.run(["rm", "-rf", "--one-file-system", state.workdir], check=False)
    state.path.unlink(missing_ok=True)


def restore_orphans() -> list[str]:
    """Restores what SIGKILLed earlier runs left behind; returns their node ids."""
    restored = []
    for path in sorted(STATE_DIR.glob("*.json")):
        with contextlib.suppress(FileNotFoundError):
            state = HostState.load(path)
            if Path(f"/proc/{state.owner}").exists():
                continue
            restore(state)
            restored.append(state.node_id)
    return restored


@contextlib.contextmanager
def exclusive_node(timeout: float = 600.0) -> Iterator[None]:
    """One real node per machine at a time: the kernel-wide sysctls are shared, and so are
    the shadowed paths. The lock dies with its holder, so a SIGKILLed run never blocks."""
    STATE_DIR.mkdir(exist_ok=True)
    with (STATE_DIR / "lock").open("w") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"another real node held {STATE_DIR / 'lock'} for {timeout} s"
                    ) from None
                time.sleep(1)
        try:
            restore_orphans()
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
