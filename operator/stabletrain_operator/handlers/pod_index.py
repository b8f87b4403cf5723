"""The index that routes pod events to their job.

A pod handler cannot patch its parent job (kopf patches only the object it handles, and two
writers of one status would race), so pods are only indexed here; the job's daemon reads
the index each tick and writes the job's status itself.

Async although it awaits nothing: kopf runs a sync handler in a worker thread, one hop per
pod event, and a 256-pod job's stop and relaunch deliver over a thousand of them.
"""

from __future__ import annotations

from typing import Any

import kopf

from stabletrain_operator import naming
from stabletrain_operator.observe.pods import PodFacts, pod_facts

PodKey = tuple[str, str]
"""(namespace, job name)."""


@kopf.index("", "v1", "pods", labels={naming.JOB_LABEL: kopf.PRESENT})
async def worker_pods(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[PodKey, PodFacts] | None:
    facts = pod_facts(body)
    if facts is None or namespace is None:
        return None
    return {(namespace, labels[naming.JOB_LABEL]): facts}
