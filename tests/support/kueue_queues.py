"""One ResourceFlavor, ClusterQueue and LocalQueue per test (cluster-scoped names made
unique), removed afterwards while Kueue still runs (its finalizers need it)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from support.kueue import KueueObjects

Json = dict[str, Any]


@dataclass(frozen=True)
class Queues:
    flavor: str
    cluster_queue: str
    local_queue: str
    priority_classes: tuple[str, ...]


@contextlib.contextmanager
def queues(
    objects: KueueObjects,
    namespace: str,
    *,
    cpu: str,
    node_labels: dict[str, str] | None = None,
    priorities: dict[str, int] | None = None,
) -> Iterator[Queues]:
    """A ClusterQueue with `cpu` of quota in one flavor (whose node labels are
    `node_labels`), preempting lower priorities within itself, a LocalQueue `team` in
    `namespace`, and WorkloadPriorityClasses `priorities` (name suffix -> value)."""
    suffix = uuid.uuid4().hex[:6]
    flavor, cluster_queue = f"flavor-{suffix}", f"cq-{suffix}"
    classes = {f"{name}-{suffix}": value for name, value in (priorities or {}).items()}
    try:
        objects.create("resourceflavors", {
            "metadata": {"name": flavor},
            "spec": {"nodeLabels": node_labels or {}},
        })  # fmt: skip
        objects.create("clusterqueues", {
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [{
                    "coveredResources": ["cpu"],
                    "flavors": [{"name": flavor,
                                 "resources": [{"name": "cpu", "nominalQuota": cpu}]}],
                }],
            },
        })  # fmt: skip
        objects.create("localqueues", {
            "metadata": {"name": "team"}, "spec": {"clusterQueue": cluster_queue},
        }, namespace)  # fmt: skip
        for name, value in classes.items():
            objects.create("workloadpriorityclasses", {"metadata": {"name": name},
                                                       "value": value})  # fmt: skip
        _wait_active(objects, cluster_queue)
        yield Queues(flavor, cluster_queue, "team", tuple(classes))
    finally:
        for name in classes:
            objects.delete("workloadpriorityclasses", name)
        objects.delete("clusterqueues", cluster_queue)
        objects.delete("resourceflavors", flavor)


def _wait_active(objects: KueueObjects, cluster_queue: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conditions = (objects.cluster_queue(cluster_queue).get("status") or {}).get(
            "conditions"
        ) or []
        if any(c["type"] == "Active" and c["status"] == "True" for c in conditions):
            return
        time.sleep(0.2)
    raise AssertionError(f"ClusterQueue {cluster_queue} not Active after {timeout} s")
