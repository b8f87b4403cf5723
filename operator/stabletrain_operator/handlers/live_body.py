"""What kopf keeps of each job between its watch events: the metadata its daemon reads.

kopf holds the newest watched version of every object that has a daemon (the daemon's live
`body`) and swaps in each new event's object. A job's daemon reads only the metadata of it:
version, uid, labels, deletion (handlers/jobs.py, reconcile.tick); the spec and status it acts
on are read from the API server when the version changes and held parsed (jobview.py). The
rest of the object was the largest part of what the operator held per job: at 1,000 jobs
kopf's copies came to 51 KiB a job, 28 KiB of it managedFields, and dropping it took the
operator from 303-320 to 249-256 MiB together with heap_trim.py (bench/operator_scale.py,
docs/operations.md "Memory").

So the job's event handler empties the event's object before kopf keeps it. kopf hands event
handlers the very dict its daemon body views (`event["object"]`), and it runs them before it
spawns daemons, so the first version it keeps is emptied too.
"""

from __future__ import annotations

from typing import Any

import kopf

from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION

DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
"""Annotations nobody in the operator reads: `kubectl apply` stores the whole spec again
there, as text."""


def keep_metadata_only(job: dict[str, Any]) -> None:
    """Removes from a watched job what neither the daemon nor kopf reads: its spec, its
    status, its managedFields and kubectl's copy of the spec. kopf's own annotations and
    finalizers stay (its progress and diff-base storage, the deletion it blocks)."""
    job.pop("spec", None)
    job.pop("status", None)
    metadata = job.get("metadata")
    if not isinstance(metadata, dict):
        return
    metadata.pop("managedFields", None)
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict):
        for key in DROPPED_ANNOTATIONS:
            annotations.pop(key, None)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def hold_metadata_only(event: kopf.RawEvent, **_: Any) -> None:
    """Async: a sync handler would cost a hop to a thread for every event of every job."""
    job: object = event.get("object")
    if isinstance(job, dict):
        keep_metadata_only(job)
