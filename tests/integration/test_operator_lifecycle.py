"""A StableTrainingJob on the real control plane, its pods run by the local node under
torchrun, reconciled by the operator as a separate process: created, running, reporting,
succeeded; suspended and resumed from the newest checkpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.operator import (
    Jobs,
    OperatorProcess,
    create_claim,
    install_crd,
    job_manifest,
    running_operator,
)


@pytest.fixture(scope="module")
def crd(control_plane: ControlPlane) -> None:
    install_crd(control_plane)


@pytest.fixture
def operator(
    crd: None,
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    local_cluster: LocalCluster,
    pod_namespace: str,
    tmp_path: Path,
) -> Iterator[OperatorProcess]:
    create_claim(client.CoreV1Api(api_client), pod_namespace)
    with running_operator(
        control_plane, api_client, pod_namespace, tmp_path / "operator.log"
    ) as running:
        yield running


def _env(pod: client.V1Pod) -> dict[str, str]:
    values = {}
    for item in pod.spec.containers[0].env:
        if item.value is not None:
            values[item.name] = item.value
        elif item.value_from.field_ref is not None:
            values[item.name] = "field:" + item.value_from.field_ref.field_path
        else:
            values[item.name] = "secret:" + item.value_from.secret_key_ref.name
    return values


def test_job_runs_its_torchrun_pods_to_success(
    operator: OperatorProcess, api_client: client.ApiClient, pod_namespace: str
) -> None:
    jobs = Jobs(api_client, pod_namespace)
    jobs.create(job_manifest("life", {"ST_STEPS": "30", "ST_STEP_SECONDS": "0.1"}))

    running = jobs.wait(
        "life",
        lambda s: s.get("phase") == "Running" and (s.get("step") or 0) >= 3,
        90,
        "the job to run and report steps",
    )
    assert running["attempt"] == 0
    assert running["directivesGeneration"] == 1
    pods = {p.metadata.name: p for p in jobs.pods("life")}
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
    assert rank1.spec.hostname == "life-a0-1"
    assert rank1.spec.subdomain == "life"
    assert rank1.spec.restart_policy == "Never"
    assert rank1.metadata.labels["stabletrain.dev/attempt"] == "0"
    assert rank1.metadata.owner_references[0].kind == "StableTrainingJob"
    core = client.CoreV1Api(api_client)
    service = core.read_namespaced_service("life", pod_namespace)
    assert service.spec.cluster_ip == "None"
    directives = core.read_namespaced_config_map("life-a0-directives", pod_namespace)
    assert json.loads(directives.data["directives.json"])["generation"] == 1

    done = jobs.wait("life", lambda s: s.get("phase") == "Succeeded", 90, "success")
    conditions = {c["type"]: c for c in done["conditions"]}
    assert conditions["Complete"]["status"] == "True"
    assert done["step"] >= 25
    assert done["checkpoints"], "the scraped inventory reached status"
    assert any(e.reason == "TrainingComplete" for e in jobs.events("life"))
