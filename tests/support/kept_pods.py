"""What the end-to-end tests of recoveries in place look at: the job's pods as kubectl shows
them (names, UIDs, nodes, container restarts, the attempt each runs) and what each pod's
supervisor wrote to its log."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.operator import Jobs

ATTEMPT_COLUMN = r"ATTEMPT:.metadata.labels.stabletrain\.dev/attempt"
COLUMNS = ",".join(
    (
        "NAME:.metadata.name",
        "UID:.metadata.uid",
        "NODE:.spec.nodeName",
        "PHASE:.status.phase",
        "RESTARTS:.status.containerStatuses[0].restartCount",
        ATTEMPT_COLUMN,
    )
)
_STARTED = re.compile(r"supervisor: attempt (\d+) started")


@dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    node: str
    restarts: int
    attempt: int


def pods_of(jobs: Jobs, job: str) -> dict[str, PodView]:
    """Every pod of the job, by name."""
    found = {}
    for pod in jobs.pods(job):
        metadata, status = pod["metadata"], pod.get("status") or {}
        containers = status.get("containerStatuses") or [{}]
        found[metadata["name"]] = PodView(
            name=metadata["name"],
            uid=metadata["uid"],
            node=(pod.get("spec") or {}).get("nodeName") or "",
            restarts=int(containers[0].get("restartCount") or 0),
            attempt=int(metadata["labels"]["stabletrain.dev/attempt"]),
        )
    return found


def kubectl_pods(plane: ControlPlane, namespace: str) -> str:
    """`kubectl get pods -o wide` and the UIDs, restart counts and attempts, as printed."""
    wide = plane.kubectl("get", "pods", "-n", namespace, "-o", "wide")
    uids = plane.kubectl("get", "pods", "-n", namespace, "-o", f"custom-columns={COLUMNS}")
    return "\n".join(
        subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        for argv in (wide, uids)
    )


def attempts_started(cluster: LocalCluster, namespace: str, pod: str) -> list[int]:
    """The attempts the pod's supervisor started, in order, from the pod's own log."""
    return [int(a) for a in _STARTED.findall(cluster.logs(namespace, pod))]
