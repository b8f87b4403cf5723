"""The stability preflight on the real control plane: a real PyTorch script under the Guard
on the local node, the operator as a separate process. A job without gradient clipping gets
the Preflight condition from its running pods (Warn); with Refuse it gets the condition from
one preflight pod and no worker pod at all, until a changed spec passes."""

from __future__ import annotations

import time
from typing import Any

from support.localnode import LocalCluster
from support.operator import REPO, Jobs, OperatorProcess, job_manifest

WORKER = REPO / "tests" / "support" / "workloads" / "guarded_worker.py"
NO_CLIP = {"ST_CLIP": "none", "ST_STEP_SECONDS": "0.1"}


def guarded_job(name: str, env: dict[str, str], **spec: Any) -> dict[str, Any]:
    manifest = job_manifest(name, env)
    container = manifest["spec"]["workers"]["template"]["spec"]["containers"][0]
    container["command"] = ["torchrun", str(WORKER)]
    manifest["spec"].update(spec)
    return manifest


def preflight(status: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Preflight"), None)


def worker_pods(jobs: Jobs, name: str) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in jobs.pods(name)
        if "stabletrain.dev/attempt" in p["metadata"]["labels"]
    ]


def test_a_job_without_clipping_gets_the_preflight_condition_and_still_runs(
    operator: OperatorProcess, jobs: Jobs, local_cluster: LocalCluster
) -> None:
    jobs.create(guarded_job("warn", {**NO_CLIP, "ST_STEPS": "150"}))

    status = jobs.wait(
        "warn", lambda s: preflight(s) is not None, 90, "the running pods' preflight facts"
    )
    condition = preflight(status)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "PreflightSevereFindings")
    lines = condition["message"].splitlines()
    assert lines[0].startswith("Severe: no-clipping: gradients are not clipped")
    assert "fix: pass max_grad_norm=1.0 to the Guard" in lines[0]
    assert status["phase"] == "Running", "Warn mode never stops a run"
    assert len(worker_pods(jobs, "warn")) == 2
    (event,) = [e for e in jobs.events("warn") if e["reason"] == "PreflightSevereFindings"]
    assert event["type"] == "Warning"
    assert "no-clipping" in event["message"]
    print(f"Warn: Preflight condition {condition}")


def test_refuse_mode_starts_no_worker_pod_until_a_fixed_spec_passes(
    operator: OperatorProcess, jobs: Jobs, local_cluster: LocalCluster
) -> None:
    manifest = guarded_job("refuse", {**NO_CLIP, "ST_STEPS": "20"}, preflight={"mode": "Refuse"})
    jobs.create(manifest)

    refused = jobs.wait(
        "refuse",
        lambda s: (preflight(s) or {}).get("reason") == "PreflightRefused",
        90,
        "the preflight pod's facts to be refused",
    )
    condition = preflight(refused)
    assert condition is not None
    assert condition["status"] == "False"
    assert condition["message"].startswith("Severe: no-clipping:")
    assert condition["observedGeneration"] == 1
    time.sleep(3)
    assert worker_pods(jobs, "refuse") == [], "a refused job creates no worker pod"
    assert jobs.status("refuse")["phase"] == "Pending"
    (checked,) = jobs.pods("refuse")
    assert checked["metadata"]["name"] == "refuse-preflight-g1"
    assert checked["status"]["phase"] == "Succeeded", "the preflight pod exits 0 before step 1"
    reasons = [e["reason"] for e in jobs.events("refuse")]
    assert "PreflightRefused" in reasons
    assert "Created" not in reasons

    container = manifest["spec"]["workers"]["template"]["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != "ST_CLIP"]
    jobs.patch_spec("refuse", {"workers": manifest["spec"]["workers"]})
    started = jobs.wait(
        "refuse", lambda s: s.get("phase") in ("Running", "Succeeded"), 90,
        "the fixed spec to pass its preflight and start",
    )  # fmt: skip
    passed = preflight(started)
    assert passed is not None
    assert passed["status"] == "True"
    assert passed["observedGeneration"] == 2
    assert "no-clipping" not in passed["message"]
    assert sorted(worker_pods(jobs, "refuse")) == ["refuse-a0-0", "refuse-a0-1"]
    print(f"Refuse: refused with {condition}; after the fix {passed}")
