"""The job as its daemon knows it, without asking the API server every tick.

kopf's watch keeps the daemon's live body current, so a tick compares versions instead of
reading the job. The live body is the job's metadata only (handlers/live_body.py): the spec
and status a tick acts on are the ones held here. Two rules keep a tick from acting on a
state older than one it already saw:

- The daemon holds the newest version it read or wrote. While the live body shows another
  version for less than `WATCH_LAG_SECONDS` since then, the watch is assumed to be catching
  up (right after the daemon's own write it always is) and the held version is used. If a
  different version lasts longer, the job is read once from the API server: either somebody
  else changed it, or the watch is that late (a restarted API server).
- Progress numbers (step, loss, grad norm, throughput) are written at a bounded rate; the
  ones not written yet are carried in the held status, so the next decision still sees them
  and writes them with itself.

A status write refused with 409 drops the held version: the next tick reads the job afresh.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import ValidationError

from stabletrain_contract.base import AS_WRITTEN
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus

Json = dict[str, Any]

WATCH_LAG_SECONDS = 2.0
"""How long a live body that differs from the held version is taken for a watch catching up."""

DEFAULT_PROGRESS_WRITE_SECONDS = 30.0
"""Least time between two writes that only move progress numbers (`--progress-write-seconds`):
`kubectl get stj` lags the run by at most this, for at most two requests per job a minute."""

PROGRESS_FIELDS = ("step", "loss", "loss_baseline", "grad_norm", "tokens_per_second")
"""Status fields every scrape refreshes and no decision is recorded in."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobView:
    resource_version: str
    job: Json
    """The object's identity at that version (`identity`), as read or as the status write
    returned it."""
    spec: StableTrainingJobSpec
    status: StableTrainingJobStatus
    """The status at that version, plus the progress numbers not written since."""
    obtained_at: float
    """time.monotonic() of the read or the write."""


IDENTITY_KEYS = ("name", "namespace", "uid", "resourceVersion", "generation")


def identity(job: Json) -> Json:
    """What a tick needs of the object besides its spec and status: the names, uid, version
    and generation its Events, owner references and conditions carry. The whole object (its
    managedFields and status) was some 28 KiB of Python objects per job, a second copy of
    what kopf's live body holds: 28 MiB of the operator at 1,000 jobs."""
    metadata = job["metadata"]
    return {
        "apiVersion": job.get("apiVersion"),
        "kind": job.get("kind"),
        "metadata": {key: metadata[key] for key in IDENTITY_KEYS if key in metadata},
    }


class Source(Enum):
    HELD = "held"
    READ = "read"


def source(held: JobView | None, live_version: str | None, now: float) -> Source:
    """Whether a tick can act on the held version or must read the job from the API server."""
    if held is None:
        return Source.READ
    if live_version == held.resource_version or now - held.obtained_at < WATCH_LAG_SECONDS:
        return Source.HELD
    return Source.READ


def look_again_by(acted_on: JobView, live_version: str | None, due: float) -> float:
    """The latest time of the next tick, given that this tick acted on `acted_on` and would
    next tick at `due`. A tick that acted on a held version while the live body showed
    another (a change that arrived while the watch caught up with the daemon's own write)
    looks again when the watch has had its time, even in a phase that otherwise waits for a
    minute: a spec.suspend cleared right after the job was suspended resumes the job then."""
    if live_version == acted_on.resource_version:
        return due
    return min(due, acted_on.obtained_at + WATCH_LAG_SECONDS)


def parse(job: Json) -> tuple[StableTrainingJobSpec, StableTrainingJobStatus] | None:
    """Spec and status of `job`; None (and the reason logged) when either does not validate."""
    name = job["metadata"]["name"]
    try:
        spec = StableTrainingJobSpec.model_validate(
            job.get("spec") or {}, context={AS_WRITTEN: True}
        )
    except ValidationError as error:
        _log.error("job %s: spec does not match the StableTrainingJob schema: %s", name, error)
        return None
    try:
        status = StableTrainingJobStatus.model_validate(
            job.get("status") or {}, context={"job": name}
        )
    except ValidationError as error:
        _log.error("job %s: status is not what this operator writes: %s", name, error)
        return None
    return spec, status


class StatusWrite(Enum):
    """Why a status is written: the two kinds wait for the API pool differently
    (reconcile._record)."""

    DECISION = "Decision"
    """A change beyond the progress numbers: written at once."""
    PROGRESS = "Progress"
    """Progress numbers alone, at most once per `progress_seconds`."""


def write_needed(
    before: StableTrainingJobStatus,
    after: StableTrainingJobStatus,
    *,
    progress_written_at: float,
    now: float,
    progress_seconds: float,
) -> StatusWrite | None:
    """A change beyond the progress numbers is written at once; progress alone at most once
    per `progress_seconds`; None when nothing is due."""
    if after == before:
        return None
    unchanged_progress = {name: getattr(before, name) for name in PROGRESS_FIELDS}
    if after.model_copy(update=unchanged_progress) != before:
        return StatusWrite.DECISION
    if now - progress_written_at >= progress_seconds:
        return StatusWrite.PROGRESS
    return None
