"""Acting on a job by hand: a manual rollback, suspend and resume, each optionally waited for.

The CLI only writes the spec; the operator carries the change out and reports in status.
A manual rollback carries a request id so it runs once: repeating the command with the same
`--request-id` does not create a second request, and a different request is refused while
one is still pending, because overwriting it would lose it silently.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import NAME_PATTERN
from stabletrain_operator.cli.cluster import Cluster
from stabletrain_operator.cli.errors import USAGE_EXIT, CliError
from stabletrain_operator.cli.views import job_status

POLL_SECONDS = 1.0
TERMINAL = frozenset({Phase.FAILED, Phase.SUCCEEDED})


def new_request_id(now: datetime) -> str:
    """Sortable by time, unique by 24 random bits, and a valid DNS label as the API demands."""
    return f"rb-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def request_rollback(
    cluster: Cluster,
    name: str,
    *,
    to_step: int | None,
    lr_factor: float | None,
    reason: str,
    request_id: str | None,
    replace: bool,
) -> tuple[str, bool]:
    """Write spec.manualRollback; returns (request id, whether a new request was written)."""
    if request_id is not None and not _is_label(request_id):
        raise CliError(
            f"--request-id {request_id!r} must be a DNS label (lower case letters, digits "
            "and '-', at most 63)",
            exit_code=USAGE_EXIT,
        )
    job = cluster.get(name)
    status = job_status(job)
    pending = ((job.get("spec") or {}).get("manualRollback") or {}).get("requestId")
    if request_id is not None and request_id in (pending, status.last_manual_request_id):
        return request_id, False
    if pending and pending != status.last_manual_request_id and not replace:
        raise CliError(
            f"manual rollback {pending} of {name} is still pending (the operator has not "
            "handled it yet); wait for it, or pass --replace to supersede it"
        )
    chosen = request_id or new_request_id(datetime.now(UTC))
    # A merge patch merges nested objects: every field is written (null deletes) so that
    # nothing of an earlier request (its skip ranges, its reason) leaks into this one.
    request: dict[str, Any] = {
        "requestId": chosen,
        "toStep": to_step,
        "lrFactor": lr_factor,
        "skip": None,
        "reason": reason or None,
    }
    cluster.patch_spec(
        name, {"manualRollback": request}, resource_version=job["metadata"]["resourceVersion"]
    )
    return chosen, True


def set_suspend(cluster: Cluster, name: str, *, suspend: bool) -> bool:
    """Set spec.suspend; False when it already had that value (nothing written)."""
    job = cluster.get(name)
    if bool((job.get("spec") or {}).get("suspend", False)) == suspend:
        return False
    cluster.patch_spec(name, {"suspend": suspend})
    return True


class JobReader(Protocol):
    """What waiting needs from the cluster: read one job."""

    def get(self, name: str) -> dict[str, Any]: ...


def wait_for(
    cluster: JobReader,
    name: str,
    done: Callable[[dict[str, Any]], bool],
    *,
    what: str,
    timeout: float,
    progress: TextIO,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Poll the job until `done`, printing each phase change; CliError on timeout or Failed."""
    deadline = clock() + timeout
    last_phase = None
    while True:
        job = cluster.get(name)
        status = job_status(job)
        if status.phase != last_phase:
            step = "" if status.step is None else f", step {status.step}"
            print(f"  {name}: {status.phase.value} (attempt {status.attempt}{step})", file=progress)
            last_phase = status.phase
        if done(job):
            return job
        if status.phase in TERMINAL:
            raise CliError(f"{name} is {status.phase.value} while waiting for {what}")
        if clock() >= deadline:
            raise CliError(
                f"timed out after {timeout:g} s waiting for {what} (phase {status.phase.value}); "
                "is the operator running? `stabletrain status` shows where it stands"
            )
        sleep(POLL_SECONDS)


def rollback_done(request_id: str) -> Callable[[dict[str, Any]], bool]:
    """The operator handled the request and the run is back to Running."""

    def done(job: dict[str, Any]) -> bool:
        status = job_status(job)
        return status.last_manual_request_id == request_id and status.phase is Phase.RUNNING

    return done


def phase_is(phase: Phase) -> Callable[[dict[str, Any]], bool]:
    def done(job: dict[str, Any]) -> bool:
        return job_status(job).phase is phase

    return done


def _is_label(value: str) -> bool:
    return len(value) <= 63 and re.fullmatch(NAME_PATTERN, value) is not None
