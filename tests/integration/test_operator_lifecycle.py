"""A StableTrainingJob on the real control plane, its pods run by the local node under
torchrun, reconciled by the operator as a separate process: created, running, reporting,
succeeded; suspended and resumed from the newest checkpoint."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from support.localnode import LocalCluster
from support.operator import (
    Jobs,
    OperatorProcess,
    job_manifest,
    worker_log,
)


def _env(pod: dict[str, Any]) -> dict[str, str]:
    values = {}
    for item in pod["spec"]["containers"][0]["env"]:
        source = item.get("valueFrom") or {}
        if "value" in item:
            values[item["name"]] = item["value"]
        elif "fieldRef" in source:
            values[item["name"]] = "field:" + source["fieldRef"]["fieldPath"]
        else:
            values[item["name"]] = "secret:" + source["secretKeyRef"]["name"]
    return values


def test_job_runs_its_torchrun_pods_to_success(
    operator: OperatorProcess, jobs: Jobs, api_client: client.ApiClient, job_namespace: str
) -> None:
    pod_namespace = job_namespace
    jobs.create(job_manifest("life", {"ST_STEPS": "30", "ST_STEP_SECONDS": "0.1"}))

    running = jobs.wait(
        "life",
        lambda s: s.get("phase") == "Running" and (s.get("step") or 0) >= 3,
        90,
        "the job to run and report steps",
    )
    assert operator.probe() == 200, "kopf's liveness endpoint answers"
    assert running["attempt"] == 0
    assert running["directivesGeneration"] == 1
    pods = {p["metadata"]["name"]: p for p in jobs.pods("life")}
    assert sorted(pods) == ["life-a0-0", "life-a0-1"]
    rank1 = pods["life-a0-1"]
    env = _env(rank1)
    assert env["PET_NNODES"] == "2"
    assert env["PET_NODE_RANK"] == "1"
    assert env["PET_RDZV_ID"] == "life-0"
    assert env["PET_RDZV_ENDPOINT"] == f"life-a0-0.life.{pod_namespace}.svc:29400"
    assert env["PET_LOCAL_ADDR"] == "field:status.podIP"
    assert env["STABLETRAIN_ATTEMPT"] == "0"
    assert env["STABLETRAIN_DIRECTIVES_TOKEN"] == "secret:life-token"
    assert rank1["spec"]["hostname"] == "life-a0-1"
    assert rank1["spec"]["subdomain"] == "life"
    assert rank1["spec"]["restartPolicy"] == "Never"
    assert rank1["metadata"]["labels"]["stabletrain.dev/attempt"] == "0"
    assert rank1["metadata"]["ownerReferences"][0]["kind"] == "StableTrainingJob"
    service: Any = client.CoreV1Api(api_client).read_namespaced_service("life", pod_namespace)
    assert service.spec.cluster_ip == "None"
    directives = jobs.config_map("life-a0-directives")
    assert json.loads(directives["data"]["directives.json"])["generation"] == 1

    done = jobs.wait("life", lambda s: s.get("phase") == "Succeeded", 90, "success")
    conditions = {c["type"]: c for c in done["conditions"]}
    assert conditions["Complete"]["status"] == "True"
    assert 0 < done["step"] <= 30, "the last scraped step"
    assert done["checkpoints"], "the scraped inventory reached status"
    assert any(e["reason"] == "TrainingComplete" for e in jobs.events("life"))


def test_suspend_stops_the_pods_and_resume_relaunches_from_the_newest_checkpoint(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    jobs.create(job_manifest("nap", {"ST_STEPS": "60", "ST_STEP_SECONDS": "0.1"}))
    jobs.wait("nap", lambda s: (s.get("step") or 0) >= 17, 90, "step 17")

    jobs.patch_spec("nap", {"suspend": True})
    suspended = jobs.wait("nap", lambda s: s.get("phase") == "Suspended", 90, "suspension")
    assert jobs.pods("nap") == []
    conditions = {c["type"]: c for c in suspended["conditions"]}
    assert conditions["Suspended"]["status"] == "True"
    newest = max(
        r["step"] for r in suspended["checkpoints"] if r["stable"] and r["pfs"]["verified"]
    )

    jobs.patch_spec("nap", {"suspend": False})
    done = jobs.wait("nap", lambda s: s.get("phase") == "Succeeded", 120, "the resumed run")
    assert done["attempt"] == 1
    assert done["counters"]["restarts"] == done["counters"]["rollbacks"] == 0
    assert done["rollbackHistory"] == []
    resumed = worker_log(local_cluster, job_namespace, attempt=1, rank=0)
    assert resumed[0]["step"] == newest + 1
    assert resumed[-1]["step"] == 60
    assert {r["lrScale"] for r in resumed} == {1.0}
    print(f"suspended after step {newest}; resumed at step {resumed[0]['step']}")
