"""The index that routes pod events to their job.

A pod handler cannot patch its parent job (kopf patches only the object it handles, and two
writers of one status would race), so pods are only indexed here; the job's daemon reads
the index each tick and writes the job's status itself.

Keyed by the UID of the job that controls the pod (ownership.py), not by its labels alone:
a pod anybody labelled with a job's name, or one left by an earlier job of that name, is
in no job's entry, so it is never scraped, sent the job's token, or read for a report.

Async although it awaits nothing: kopf runs a sync handler in a worker thread, one hop per
pod event, and a 256-pod job's stop and relaunch deliver over a thousand of them.
"""

from __future__ import annotations

from typing import Any

import kopf

from stabletrain_operator import naming
from stabletrain_operator.observe.pod_facts import PodFacts, pod_facts
from stabletrain_operator.ownership import controller

PodKey = tuple[str, str]
"""(namespace, job name)."""
OwnerKey = tuple[str, str, str]
"""(namespace, job name, job UID)."""


@kopf.index("", "v1", "pods", labels={naming.JOB_LABEL: kopf.PRESENT})
async def worker_pods(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[OwnerKey, PodFacts] | None:
    owner = controller(body.metadata)
    job = labels[naming.JOB_LABEL]
    if owner is None or owner.get("name") != job or namespace is None:
        return None
    facts = pod_facts(body)
    if facts is None:
        return None
    return {(namespace, job, str(owner.get("uid"))): facts}
