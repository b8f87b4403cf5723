"""Linux namespaces held open by a sleeping process, the way a pod sandbox's pause container does.

A namespace lives as long as a process is in it, so holding each one with a `sleep` that dies
with its spawning thread (setpriv --pdeathsig, see support.processes) means a crashed or killed
test run cannot leave a network namespace, a bridge or a veth behind: the kernel removes them
with their last process. Nothing is ever bind-mounted under /run/netns.

With a PID namespace the `sleep` is its PID 1 (unshare --fork --kill-child): when the holder
dies, the kernel kills every process in that namespace, wherever it went (new sessions too).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from support.localnode.registry import CREATED
from support.processes import ManagedProcess

MARKER_ENV = "STABLETRAIN_LOCALNODE"
"""Every process a local cluster starts carries this variable, so a sweep can find them all."""


def namespace_inode(pid: int, kind: str) -> int:
    """The inode that identifies a process's namespace of one kind (net, uts, mnt)."""
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino


class NamespaceHolder:
    """A `sleep infinity` in fresh namespaces of the given kinds: the anchor others join."""

    def __init__(self, name: str, kinds: Sequence[str], log_path: Path, marker: str) -> None:
        flags = [f"--{kind}" for kind in kinds]
        if "pid" in kinds:
            flags.append("--kill-child=SIGKILL")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), MARKER_ENV: marker}
        self.kinds = tuple(kinds)
        self._target: int | None = None
        self.process = ManagedProcess(
            name, ["unshare", *flags, "--", "sleep", "infinity"], log_path, env=env
        )
        self._wait_until_unshared()
        self.inodes = {short: namespace_inode(self.pid, short) for _, short in self._short_kinds()}
        for short, inode in self.inodes.items():
            CREATED.add_namespace(short, inode)

    def _short_kinds(self) -> list[tuple[str, str]]:
        short = {"net": "net", "uts": "uts", "mount": "mnt", "ipc": "ipc", "pid": "pid"}
        return [(kind, short[kind]) for kind in self.kinds]

    def _wait_until_unshared(self, timeout: float = 10.0) -> None:
        """unshare(2) happens just after the fork; joining earlier would join the host's."""
        mine = {short: namespace_inode(os.getpid(), short) for _, short in self._short_kinds()}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise RuntimeError(f"{self.process.name} exited: {self.process.log_tail()}")
            try:
                target = self._find_target()
                if target and all(namespace_inode(target, s) != ino for s, ino in mine.items()):
                    self._target = target
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.005)
        raise RuntimeError(f"{self.process.name}: namespaces not created within {timeout} s")

    def _find_target(self) -> int | None:
        """The process in the namespaces: unshare itself, or with a PID namespace its child."""
        if "pid" not in self.kinds:
            return self.process.pid
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        found = children.read_text().split()
        return int(found[0]) if found else None

    @property
    def pid(self) -> int:
        """The PID (in this process's PID namespace) to join the namespaces through."""
        return self._target if self._target is not None else self.process.pid

    def enter(self, *kinds: str) -> list[str]:
        """argv prefix that runs a command inside this holder's namespaces of those kinds."""
        return ["nsenter", f"--target={self.pid}", *(f"--{kind}" for kind in kinds), "--"]

    def run(self, *argv: str, kinds: Sequence[str] = ("net",)) -> None:
        """Runs a set-up command inside the namespaces; a failure names the command and why."""
        command = [*self.enter(*kinds), *argv]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")

    def stop(self) -> None:
        self.process.stop(grace=0)
