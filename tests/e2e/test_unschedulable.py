"""Without Kueue: a job whose pods no node can take says so within its bound, in the
scheduler's own words (the local node's scheduler, tests/support/localnode/scheduler.py)."""

from __future__ import annotations

import time
from datetime import datetime

from support.controlplane import ControlPlane
from support.kubectl_table import kubectl_get, rows
from support.operator import Jobs, OperatorProcess
from support.tinygpt import job_manifest

BOUND = 5
TICK_SLACK = 10
"""Seconds past the bound the condition may come: a running job ticks every second (its
scrape round) and kubectl's timestamps have one-second resolution; the rest is load."""


def test_without_kueue_unschedulable_pods_say_so_with_the_schedulers_words(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, control_plane: ControlPlane
) -> None:
    manifest = job_manifest("nowhere", {"TINYGPT_STEPS": "20"})
    manifest["spec"]["workers"]["template"]["spec"]["nodeSelector"] = {"pool": "h100"}
    manifest["spec"]["scheduling"] = {"unschedulableSeconds": BOUND}
    created = time.monotonic()
    jobs.create(manifest)
    status = jobs.wait(
        "nowhere",
        lambda s: any(c["type"] == "Unschedulable" and c["status"] == "True"
                      for c in s.get("conditions") or []),
        BOUND + 30,
        "the Unschedulable condition",
    )  # fmt: skip
    took = time.monotonic() - created
    (said,) = [c for c in status["conditions"] if c["type"] == "Unschedulable"]
    # From the pods' creation (the bound's start) to the condition: the bound, then a tick.
    born = max(datetime.fromisoformat(p["metadata"]["creationTimestamp"])
               for p in jobs.pods("nowhere"))  # fmt: skip
    after = (datetime.fromisoformat(said["lastTransitionTime"]) - born).total_seconds()
    assert BOUND <= after <= BOUND + TICK_SLACK, after
    assert said["reason"] == "Unschedulable"
    assert "nowhere-a0-0, nowhere-a0-1" in said["message"]
    assert "0/2 nodes are available" in said["message"], "the scheduler's own words"
    assert "nodeSelector pool=h100 does not match" in said["message"]
    assert status["unschedulablePods"] == 2
    assert status["phase"] == "Running", "Wait (the default) keeps the pods"
    (event,) = [e for e in jobs.events("nowhere") if e["reason"] == "Unschedulable"]
    assert event["type"] == "Warning"
    assert event["message"] == said["message"]
    table = kubectl_get(control_plane, "stj", "-n", job_namespace)
    assert rows(table)["nowhere"]["UNSCHEDULABLE"] == "2", table
    print(
        f"\nUnschedulable {after:.1f} s after the pods were created, {took:.1f} s after the "
        f"job (bound {BOUND} s): {said['message']}\n{table}"
    )
