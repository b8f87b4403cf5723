"""What a healthy running job costs the API server: no read of the job while nothing but its
agents' numbers change, and progress written at the operator's bounded rate.

The counts are the API server's own (`apiserver_request_total`, diffed over a window in
which the test itself sends no request about jobs). They count every client, and
kube-controller-manager's garbage collector reads a job too: until its discovery (every
30 s) has picked up a new CRD, it cannot watch the jobs, so it checks each owner of the
job's pods with a GET when it catches up, which fell into the window when this test ran
first in its session (2 GETs). The job is created once the CRD is older than that."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from stabletrain_operator.api.constants import CRD_NAME
from support.controlplane import ControlPlane, request_counts
from support.operator import Jobs, job_manifest, running_operator

WINDOW_SECONDS = 20.0
PROGRESS_WRITE_SECONDS = 30.0
GC_DISCOVERY_SECONDS = 30.0
"""kube-controller-manager's garbage collector looks for new resources this often."""
GC_CAUGHT_UP_SECONDS = GC_DISCOVERY_SECONDS + 15.0
"""A CRD this old is watched by the garbage collector (discovery plus its cache sync)."""


def _after_the_garbage_collector_watches_jobs(api_client: client.ApiClient) -> None:
    crd: Any = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(CRD_NAME)
    age = (datetime.now(UTC) - crd.metadata.creation_timestamp).total_seconds()
    time.sleep(max(0.0, GC_CAUGHT_UP_SECONDS - age))


def _job_requests(plane: ControlPlane) -> dict[tuple[str, str], float]:
    """Requests about StableTrainingJobs so far, by (verb, subresource)."""
    return {
        (verb, subresource): float(count)
        for (verb, resource, subresource), count in request_counts(plane).items()
        if resource == "stabletrainingjobs"
    }


def _settled(status: dict[str, Any]) -> bool:
    """Running with every decision a new attempt brings already written: its pods run and
    report (Ready, Healthy) and a step was completed (attemptProgressed). Each of those is
    written at once when it happens, which on a loaded machine can be well after Running."""
    conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
    return (
        status.get("phase") == "Running"
        and bool(status.get("attemptProgressed"))
        and conditions.get("Ready") == "True"
        and "Healthy" in conditions
    )


def test_a_running_job_costs_no_read_and_writes_progress_at_the_bounded_rate(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    jobs: Jobs,
    job_namespace: str,
    tmp_path: Path,
) -> None:
    with running_operator(
        control_plane,
        api_client,
        job_namespace,
        tmp_path / "operator.log",
        progress_write_seconds=PROGRESS_WRITE_SECONDS,
    ):
        _after_the_garbage_collector_watches_jobs(api_client)
        jobs.create(job_manifest("quiet", {"ST_STEPS": "100000", "ST_STEP_SECONDS": "0.1",
                                           "ST_CKPT_EVERY": "100000"}))  # fmt: skip
        jobs.wait("quiet", _settled, 120, "the job to run, report and complete a step")
        time.sleep(3)  # the last decision write's own watch event
        before = _job_requests(control_plane)
        time.sleep(WINDOW_SECONDS)
        after = _job_requests(control_plane)
        status = jobs.status("quiet")
    spent = {key: after[key] - before.get(key, 0.0) for key in after}
    spent = {key: n for key, n in spent.items() if n}
    print(f"\nrequests about the job in {WINDOW_SECONDS:.0f} s while it ran: {spent}")
    assert status["phase"] == "Running"
    assert spent.get(("GET", ""), 0) == 0, "the daemon read the job while nothing changed"
    assert spent.get(("PATCH", "status"), 0) <= 1, (
        f"more than one progress write in {WINDOW_SECONDS} s at one per {PROGRESS_WRITE_SECONDS} s"
    )
