"""The index that routes pod events to their job.

A pod handler cannot patch its parent job (kopf patches only the object it handles, and two
writers of one status would race), so pods are only indexed here; the job's daemon reads
the index each tick and writes the job's status itself.
"""

from __future__ import annotations

from typing import Any

import kopf

from stabletrain_operator import naming
from stabletrain_operator.observe.pods import PodFacts, pod_facts

PodKey = tuple[str, str]
"""(namespace, job name)."""


@kopf.index("", "v1", "pods", labels={naming.JOB_LABEL: kopf.PRESENT})
def worker_pods(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[PodKey, PodFacts] | None:
    facts = pod_facts(body)
    if facts is None or namespace is None:
        return None
    return {(namespace, labels[naming.JOB_LABEL]): facts}
