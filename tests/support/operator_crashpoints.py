"""The operator's entry point with planned crash points: proof that an action survives the
operator dying at any step, without a line of crash code in the product.

`python -m support.operator_crashpoints <operator arguments>` runs `python -m
stabletrain_operator` with the status write wrapped. CRASH_AFTER_ENV names phases
(comma-separated); right after the status write that enters one of them (before any effect
that follows the write, and before the reconcile even learns the write succeeded) the
process SIGKILLs itself, once per phase: a marker file per phase in the directory named by
CRASH_MARKERS_ENV is created first, so the restarted operator runs on.

The hook is the one call that writes a job's status (`Kube.write_status`) rather than the
reconcile's internals, which change often. Every status write goes through it and each
carries the whole status, so the first write of a phase the job has never been in is the
write that enters it, and the marker makes "first" hold across restarts.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stabletrain_operator import __main__ as operator_main
from stabletrain_operator.kube import Kube

CRASH_AFTER_ENV = "STABLETRAIN_OPERATOR_CRASH_AFTER"
CRASH_MARKERS_ENV = "STABLETRAIN_OPERATOR_CRASH_MARKERS"
MODULE = __name__
"""What `python -m` runs to start the operator with these crash points."""

_log = logging.getLogger(__name__)
Json = dict[str, Any]
WriteStatus = Callable[[Kube, str, str, str, Json], Json]


def planned_phases(environ: Mapping[str, str]) -> frozenset[str]:
    """The phases CRASH_AFTER_ENV names; empty when unset or blank."""
    raw = environ.get(CRASH_AFTER_ENV, "")
    return frozenset(p.strip() for p in raw.split(",") if p.strip())


def crash_after(phase: str, planned: frozenset[str], markers: Path) -> None:
    """SIGKILL this process if `phase` is planned and has not crashed it before."""
    if phase not in planned:
        return
    try:
        (markers / phase).touch(exist_ok=False)
    except FileExistsError:
        return
    _log.warning("planned crash point: SIGKILL after the status write entering %s", phase)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


def crashing_after_writes(
    write_status: WriteStatus, planned: frozenset[str], markers: Path
) -> WriteStatus:
    """`write_status` that, once the write succeeded, crashes at the phase it wrote."""

    def write_then_maybe_crash(
        kube: Kube, namespace: str, name: str, resource_version: str, status: Json
    ) -> Json:
        written = write_status(kube, namespace, name, resource_version, status)
        crash_after(str(status.get("phase")), planned, markers)
        return written

    return write_then_maybe_crash


def main() -> None:
    planned = planned_phases(os.environ)
    markers = os.environ.get(CRASH_MARKERS_ENV)
    if planned and markers:
        Kube.write_status = crashing_after_writes(  # type: ignore[method-assign, assignment]
            Kube.write_status, planned, Path(markers)
        )
    operator_main.run()


if __name__ == "__main__":
    main()
