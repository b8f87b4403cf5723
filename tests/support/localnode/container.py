"""One run of one container: a process in the pod's sandbox with its own mount namespace.

The process is started through nsenter (the pod's network, UTS and PID namespaces; it forks
into the PID namespace and waits there, relaying the exit status), unshare (a fresh mount
namespace) and container_init.py (the container's filesystem view, its own session), each of
which execs the next. Signals go to the container's session, never to the waiting nsenter.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from support.localnode.api import Json
from support.localnode.container_init import PRIVATE_TOP_LEVEL, START_ERROR_EXIT_CODE
from support.localnode.sandbox import PodSandbox
from support.localnode.sweep import kill_marked
from support.processes import ManagedProcess

TERMINATION_MESSAGE_LIMIT = 4096
"""The kubelet keeps the last 4 KiB of the file."""
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
INIT_SCRIPT = Path(__file__).with_name("container_init.py")
KILL_RELAY_SECONDS = 5.0
REPO_ROOT = Path(__file__).resolve().parents[3]


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False

    def as_spec(self) -> Json:
        return {"source": str(self.source), "target": self.target, "readOnly": self.read_only}


def image_mounts() -> list[Mount]:
    """The project's tree and virtualenv when they lie where a container has its own view.

    They are the pods' "image". Where the host keeps them under /tmp (a CI clone), the
    container's private /tmp would hide them and no pod could find python; binding them at
    the same path keeps the image whole.
    """
    hidden: list[Path] = []
    for path in (REPO_ROOT, Path(sys.prefix).resolve()):
        private = len(path.parts) > 1 and path.parts[1] in PRIVATE_TOP_LEVEL
        if private and not any(path.is_relative_to(kept) for kept in hidden):
            hidden.append(path)
    return [Mount(path, str(path), read_only=True) for path in hidden]


@dataclass(frozen=True)
class Exit:
    exit_code: int
    reason: str
    message: str
    started_at: str
    finished_at: str
    signal: int | None = None


def _tail(path: Path, limit: int) -> bytes:
    with contextlib.suppress(OSError), path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - limit))
        return handle.read()
    return b""


class ContainerRun:
    def __init__(
        self,
        container: Json,
        run_dir: Path,
        *,
        log_path: Path,
        sandbox: PodSandbox,
        mounts: list[Mount],
        env: dict[str, str],
        argv: list[str],
        marker: str,
    ) -> None:
        self.container = container
        self.marker = marker
        run_dir.mkdir(parents=True)
        (run_dir / "rootfs").mkdir()
        (run_dir / "tmp").mkdir(mode=0o1777)
        self.termination_log = run_dir / "termination-log"
        self.termination_log.touch(mode=0o666)
        self.start_error = run_dir / "start-error"
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        message_path = container.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH
        all_mounts = [
            *image_mounts(),
            *mounts,
            Mount(sandbox.hosts_file, "/etc/hosts"),
            Mount(sandbox.hostname_file, "/etc/hostname"),
            Mount(sandbox.resolv_conf, "/etc/resolv.conf"),
            Mount(self.termination_log, message_path),
        ]
        spec = {
            "rootfs": str(run_dir / "rootfs"),
            "tmp": str(run_dir / "tmp"),
            "mounts": [m.as_spec() for m in all_mounts],
            "workingDir": container.get("workingDir") or "",
            "argv": argv,
            "startErrorPath": str(self.start_error),
        }
        spec_path = run_dir / "spec.json"
        spec_path.write_text(json.dumps(spec, indent=1))
        unshare = ["unshare", "--mount", "--propagation", "private", "--"]
        init = [sys.executable, "-I", "-S", str(INIT_SCRIPT), str(spec_path)]
        self.started_at = now()
        self.process = ManagedProcess(
            f"{container['name']}", [*sandbox.enter(), *unshare, *init], self.log_path, env=env
        )
        self._main_pid = self._wait_for_main_pid()

    def _wait_for_main_pid(self, timeout: float = 2.0) -> int | None:
        """nsenter's child: the container's main process (and the leader of its session)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.alive():
            with contextlib.suppress(OSError):
                found = children.read_text().split()
                if found:
                    return int(found[0])
            time.sleep(0.005)
        return None

    @property
    def pid(self) -> int:
        """The container's main process, as this machine numbers it."""
        return self._main_pid if self._main_pid is not None else self.process.pid

    def poll(self) -> Exit | None:
        """The exit, once the main process is gone (its leftovers are killed then, too)."""
        code = self.process.popen.poll()
        if code is None:
            return None
        kill_marked(self.marker)
        self.process.stop(grace=0)
        finished = now()
        if code < 0:
            return Exit(128 - code, "Error", self._message(128 - code), self.started_at,
                        finished, signal=-code)  # fmt: skip
        start_error = _tail(self.start_error, TERMINATION_MESSAGE_LIMIT).decode(errors="replace")
        if code == START_ERROR_EXIT_CODE and start_error:
            return Exit(code, "StartError", start_error, self.started_at, finished)
        reason = "Completed" if code == 0 else "Error"
        return Exit(code, reason, self._message(code), self.started_at, finished)

    def _message(self, exit_code: int) -> str:
        message = _tail(self.termination_log, TERMINATION_MESSAGE_LIMIT)
        policy = self.container.get("terminationMessagePolicy") or "File"
        if not message and exit_code != 0 and policy == "FallbackToLogsOnError":
            lines = _tail(self.log_path, FALLBACK_LOG_BYTES).splitlines()[-FALLBACK_LOG_LINES:]
            message = b"\n".join(lines)
        return message.decode(errors="replace")

    def signal(self, signum: int) -> None:
        """To the container's session; nsenter relays the exit that follows."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL to the container's session and every other marked process but nsenter,
        which then reaps the main process and relays its death; nsenter itself only if it
        does not. (Killed first, nsenter would leave the main process a zombie of the pod's
        PID 1, which never reaps.)"""
        self.signal(signal.SIGKILL)
        kill_marked(self.marker, spare=frozenset({self.process.pid}))
        try:
            self.process.popen.wait(timeout=KILL_RELAY_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
