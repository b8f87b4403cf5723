"""The supervisor's life: serve the pod's port, run the first attempt, take orders, and end
with the container (training complete, or the pod's TERM)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from stabletrain_agent.endpoint.http_server import KeepAliveWSGIServer
from stabletrain_agent.supervisor.agent_link import AgentLink
from stabletrain_agent.supervisor.attempts import Attempts, AttemptSettings
from stabletrain_agent.supervisor.front import Front
from stabletrain_agent.supervisor.launch import ColdLauncher, Launcher
from stabletrain_agent.supervisor.output import Tail
from stabletrain_agent.supervisor.own_status import TierScan
from stabletrain_agent.supervisor.processes import Reaper, become_subreaper
from stabletrain_agent.supervisor.standby import StandbyLauncher
from stabletrain_contract import env
from stabletrain_contract.supervisor import MESSAGE_MAX

_log = logging.getLogger("stabletrain.supervisor")

DEFAULT_GRACE_SECONDS = 30.0
TERM_MARGIN_SECONDS = 1.0
"""The pod's TERM: the training processes are KILLed this long before the kubelet would
KILL the supervisor, so the supervisor still records how they ended."""
USAGE = "usage: stabletrain-supervisor [--] COMMAND [ARG...]"


def _number(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"stabletrain-supervisor: {name} must be a number, got {raw!r}") from None
    if value < 0:
        raise SystemExit(f"stabletrain-supervisor: {name} must be >= 0, got {raw!r}")
    return value


def settings_from(argv: Sequence[str], environ: Mapping[str, str]) -> AttemptSettings:
    command = list(argv[1:] if argv and argv[0] == "--" else argv)
    if not command:
        raise SystemExit(f"stabletrain-supervisor: no command to run\n{USAGE}")
    port = int(_number(environ, env.AGENT_PORT, env.DEFAULT_AGENT_PORT))
    local_port = int(_number(environ, env.AGENT_LOCAL_PORT, port + 1))
    if local_port == port:
        raise SystemExit(
            f"stabletrain-supervisor: {env.AGENT_LOCAL_PORT} must differ from {env.AGENT_PORT}"
        )
    return AttemptSettings(
        argv=tuple(command),
        base_env=dict(environ),
        local_agent_port=local_port,
        run_dir=Path(environ.get(env.SUPERVISOR_RUN_DIR) or env.DEFAULT_SUPERVISOR_RUN_DIR),
        termination_path=Path(
            environ.get(env.TERMINATION_MESSAGE_PATH) or env.DEFAULT_TERMINATION_MESSAGE_PATH
        ),
        default_grace=_number(environ, env.GRACE_SECONDS, DEFAULT_GRACE_SECONDS),
    )


def main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s stabletrain-supervisor %(message)s",
    )
    environ = dict(os.environ if environ is None else environ)
    settings = settings_from(argv, environ)
    adopted = become_subreaper() or os.getpid() == 1
    if not adopted:
        _log.warning("not a child subreaper: a process orphaned by the launcher may escape a stop")
    terminated = threading.Event()

    def on_term(signum: int, _: FrameType | None) -> None:
        _log.info("signal %d: stopping the training processes", signum)
        terminated.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    tail = Tail(MESSAGE_MAX)
    launcher: Launcher = ColdLauncher(tail)
    if environ.get(env.WARM_START, "1") != "0":
        launcher = StandbyLauncher(tail, {**environ, "PYTHONUNBUFFERED": "1"})
    attempts = Attempts(settings, launcher, Reaper(everything=adopted), tail)
    front = Front(
        attempts,
        AgentLink(settings.local_agent_port),
        environ,
        environ.get(env.DIRECTIVES_TOKEN, ""),
        TierScan(environ),
    )
    bind = environ.get(env.AGENT_BIND_ADDRESS) or env.DEFAULT_AGENT_BIND_ADDRESS
    port = int(_number(environ, env.AGENT_PORT, env.DEFAULT_AGENT_PORT))
    attempts.start_first()  # queued before any order can arrive: an order comes after it
    server = KeepAliveWSGIServer((bind, port), front.app())
    server.serve_in_background("supervisor-http")
    _log.info("serving %s:%d; training agent behind it on 127.0.0.1:%d; command: %s",
              bind, port, settings.local_agent_port, " ".join(settings.argv))  # fmt: skip
    try:
        while not terminated.is_set():
            if attempts.completed():
                _log.info("training complete: the container ends")
                return 0
            attempts.wait_changed(0.5)
        return attempts.terminate(max(settings.default_grace - TERM_MARGIN_SECONDS, 0.0))
    finally:
        server.stop()


def entry() -> None:
    """The console script `stabletrain-supervisor`."""
    sys.exit(main(sys.argv[1:]))
