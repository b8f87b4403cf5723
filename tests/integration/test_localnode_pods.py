"""Pods of the real control plane run as processes on the local node: status, env, volumes,
restart policy and deletion, as a kubelet would handle them."""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path

import pytest

import stabletrain_agent
from support.localnode import LocalCluster, pod_worker
from support.localnode.api import Json, pod_path
from support.localnode.testing import (
    create,
    pod_manifest,
    read_pod,
    terminated,
    wait_for,
    wait_terminated,
)


def test_exit_code_and_termination_message(local_cluster: LocalCluster, pod_namespace: str) -> None:
    api = local_cluster.api
    script = "echo -n 'rank 0 tripped: loss spike' > /dev/termination-log; echo hello; exit 3"
    create(api, pod_namespace, "pods", pod_manifest("exits", ["sh", "-c", script]))

    state = wait_terminated(api, pod_namespace, "exits", timeout=30)
    assert state["exitCode"] == 3, state
    assert state["reason"] == "Error"
    assert state["message"] == "rank 0 tripped: loss spike"
    done = read_pod(api, pod_namespace, "exits")
    assert done is not None
    assert done["status"]["phase"] == "Failed"
    assert done["spec"]["nodeName"] in ("node-a", "node-b")
    assert "hello" in local_cluster.logs(pod_namespace, "exits")


def test_termination_message_keeps_the_last_4_kib_and_command_not_found_is_a_start_error(
    local_cluster: LocalCluster, pod_namespace: str
) -> None:
    api = local_cluster.api
    script = "head -c 5000 /dev/zero | tr '\\0' a > /dev/termination-log; printf END >> $MSG"
    script = script.replace("$MSG", "/dev/termination-log")
    create(api, pod_namespace, "pods", pod_manifest("long", ["sh", "-c", script]))
    create(api, pod_namespace, "pods", pod_manifest("missing", ["no-such-command-here"]))

    long = wait_terminated(api, pod_namespace, "long", timeout=30)
    assert long["exitCode"] == 0
    assert long["reason"] == "Completed"
    assert len(long["message"]) == 4096
    assert long["message"].endswith("aaaEND")
    missing = wait_terminated(api, pod_namespace, "missing", timeout=30)
    assert missing["reason"] == "StartError"
    assert missing["exitCode"] == 128
    assert "no-such-command-here" in missing["message"]


def field(path: str) -> Json:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def test_env_downward_api_config_sources_and_service_account_token(
    local_cluster: LocalCluster, pod_namespace: str
) -> None:
    api = local_cluster.api
    create(api, pod_namespace, "configmaps",
           {"metadata": {"name": "settings"}, "data": {"lr": "0.001", "note": "v1"}})  # fmt: skip
    create(api, pod_namespace, "secrets",
           {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}})  # fmt: skip
    script = r"""
import json, os, pathlib, time
sa = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
report = {k: os.environ[k] for k in ("POD_NAME", "POD_NAMESPACE", "POD_IP", "NODE_NAME",
          "ROLE", "LR", "TOKEN", "ADDRESS", "HOSTNAME")}
report["sa_namespace"] = (sa / "namespace").read_text()
report["ca"] = (sa / "ca.crt").read_text().startswith("-----BEGIN CERTIFICATE")
report["jwt"] = (sa / "token").read_text()
report["hostname_file"] = open("/etc/hostname").read().strip()
import stabletrain_agent, sys
report["agent"] = stabletrain_agent.__file__
report["python"] = sys.executable
note = pathlib.Path("/config/note")
report["note_before"] = note.read_text()
deadline = time.time() + 30
while note.read_text() == "v1" and time.time() < deadline:
    time.sleep(0.1)
report["note_after"] = note.read_text()
pathlib.Path("/dev/termination-log").write_text(json.dumps(report))
"""
    manifest = pod_manifest(
        "env",
        ["python", "-c", script],
        labels={"role": "trainer"},
        volumes=[{"name": "config", "configMap": {"name": "settings"}}],
        container={
            "env": [
                {"name": "POD_NAME", **field("metadata.name")},
                {"name": "POD_NAMESPACE", **field("metadata.namespace")},
                {"name": "POD_IP", **field("status.podIP")},
                {"name": "NODE_NAME", **field("spec.nodeName")},
                {"name": "ROLE", **field("metadata.labels['role']")},
                {"name": "LR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "lr"}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                {"name": "ADDRESS", "value": "$(POD_IP):29500"},
            ],
            "volumeMounts": [{"name": "config", "mountPath": "/config"}],
        },
    )
    create(api, pod_namespace, "pods", manifest)
    wait_for(lambda: (read_pod(api, pod_namespace, "env") or {}).get("status", {}).get("podIP"),
             30, "a pod IP")  # fmt: skip
    time.sleep(1)
    api.merge_patch(f"/api/v1/namespaces/{pod_namespace}/configmaps/settings",
                    {"data": {"note": "v2"}})  # fmt: skip

    state = wait_terminated(api, pod_namespace, "env", timeout=60)
    assert state["exitCode"] == 0, state
    report = json.loads(state["message"])
    pod = read_pod(api, pod_namespace, "env")
    assert pod is not None
    assert report["POD_NAME"] == "env"
    assert report["POD_NAMESPACE"] == pod_namespace
    assert report["POD_IP"] == pod["status"]["podIP"]
    assert report["ADDRESS"] == f"{pod['status']['podIP']}:29500"
    assert report["NODE_NAME"] == pod["spec"]["nodeName"]
    assert (report["ROLE"], report["LR"], report["TOKEN"]) == ("trainer", "0.001", "s3cret")
    assert report["HOSTNAME"] == report["hostname_file"] == "env"
    # The venv's python, with the repository's packages importable as in the venv.
    assert report["python"] == sys.executable
    assert report["agent"] == str(Path(stabletrain_agent.__file__))
    assert report["sa_namespace"] == pod_namespace
    assert report["ca"]
    assert (report["note_before"], report["note_after"]) == ("v1", "v2")
    payload = report["jwt"].split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["sub"] == f"system:serviceaccount:{pod_namespace}:default"
    assert claims["kubernetes.io"]["pod"] == {"name": "env", "uid": pod["metadata"]["uid"]}


def test_on_failure_restarts_until_success_and_empty_dir_survives_restarts(
    local_cluster: LocalCluster, pod_namespace: str
) -> None:
    api = local_cluster.api
    script = (
        "if [ -e /scratch/tried ]; then echo -n second > /dev/termination-log; exit 0; fi; "
        "touch /scratch/tried; exit 7"
    )
    manifest = pod_manifest(
        "flaky",
        ["sh", "-c", script],
        restartPolicy="OnFailure",
        volumes=[{"name": "scratch", "emptyDir": {}}],
        container={"volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]},
    )
    create(api, pod_namespace, "pods", manifest)

    def succeeded() -> bool:
        pod = read_pod(api, pod_namespace, "flaky")
        return pod is not None and pod["status"].get("phase") == "Succeeded"

    wait_for(succeeded, 60, "the flaky pod to succeed after a restart")
    pod = read_pod(api, pod_namespace, "flaky")
    assert pod is not None
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 7
    assert status["state"]["terminated"]["message"] == "second"


def test_always_restarts_even_a_successful_container(
    local_cluster: LocalCluster, pod_namespace: str
) -> None:
    api = local_cluster.api
    create(api, pod_namespace, "pods", pod_manifest("again", ["true"], restartPolicy="Always"))

    def restarted_twice() -> Json | None:
        pod = read_pod(api, pod_namespace, "again")
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        if statuses and statuses[0]["restartCount"] >= 2:
            return pod
        return None

    pod = wait_for(restarted_twice, 30, "two restarts")
    status = pod["status"]
    assert status["phase"] == "Running"
    assert status["containerStatuses"][0]["lastState"]["terminated"]["reason"] == "Completed"


@pytest.mark.parametrize(("trap", "stops_by"), [("exit 0", "SIGTERM"), ("", "SIGKILL")])
def test_deletion_stops_the_process_within_the_grace_period(
    local_cluster: LocalCluster, pod_namespace: str, trap: str, stops_by: str
) -> None:
    api = local_cluster.api
    grace = 3
    script = f"trap '{trap}' TERM; echo started; while :; do sleep 0.1; done"
    manifest = pod_manifest("sleeper", ["sh", "-c", script], terminationGracePeriodSeconds=grace)
    create(api, pod_namespace, "pods", manifest)

    def running_pid() -> int | None:
        pod = read_pod(api, pod_namespace, "sleeper")
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        if statuses and "running" in statuses[0]["state"]:
            return int(statuses[0]["containerID"].removeprefix("localnode://"))
        return None

    pid = wait_for(running_pid, 30, "the sleeper to run")
    wait_for(lambda: "started" in local_cluster.logs(pod_namespace, "sleeper"), 10, "its output")
    began = time.monotonic()
    api.delete(f"/api/v1/namespaces/{pod_namespace}/pods/sleeper")
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), grace + 10, "the process to stop")
    stopped_after = time.monotonic() - began
    wait_for(lambda: read_pod(api, pod_namespace, "sleeper") is None, 10, "the pod to be removed")
    # Measured from the API call, so it includes the node noticing the deletion (it polls
    # every 0.2 s) on a CPU shared with other test runs: hence two seconds of slack.
    assert stopped_after <= grace + 2
    if stops_by == "SIGTERM":
        assert stopped_after < grace - 1, f"the SIGTERM handler should exit: {stopped_after:.2f}"
    else:
        assert stopped_after >= grace - 0.5, f"SIGKILL only after the grace period: {stopped_after}"
    print(
        f"deletion ({stops_by}): process gone {stopped_after:.2f} s after delete, grace {grace} s"
    )


def test_a_pod_waits_for_its_claim_and_the_claim_is_the_shared_directory(
    local_cluster: LocalCluster, pod_namespace: str
) -> None:
    """A pod the node cannot start (a missing claim) waits with the reason, then starts."""
    api = local_cluster.api
    manifest = pod_manifest(
        "claims",
        ["sh", "-c", "echo -n ok > /pfs/flag; cat /pfs/flag > /dev/termination-log"],
        volumes=[{"name": "pfs", "persistentVolumeClaim": {"claimName": "pfs"}}],
        container={"volumeMounts": [{"name": "pfs", "mountPath": "/pfs"}]},
    )
    create(api, pod_namespace, "pods", manifest)

    def waiting_message() -> str | None:
        pod = read_pod(api, pod_namespace, "claims")
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        if statuses and "waiting" in statuses[0]["state"]:
            return str(statuses[0]["state"]["waiting"].get("message", ""))
        return None

    message = wait_for(waiting_message, 30, "the pod to wait for its claim")
    assert 'persistentvolumeclaim "pfs" not found' in message
    assert terminated(api, pod_namespace, "claims") is None
    claim = {"metadata": {"name": "pfs"}, "spec": {"accessModes": ["ReadWriteMany"],
             "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    create(api, pod_namespace, "persistentvolumeclaims", claim)
    state = wait_terminated(api, pod_namespace, "claims", timeout=30)
    assert state["message"] == "ok"
    assert (local_cluster.shared_dir / pod_namespace / "pfs" / "flag").read_text() == "ok"


def test_init_containers_are_refused_with_a_reason(
    local_cluster: LocalCluster, pod_namespace: str
) -> None:
    api = local_cluster.api
    manifest = pod_manifest("with-init", ["true"])
    manifest["spec"]["initContainers"] = [{"name": "init", "image": "local", "command": ["true"]}]
    create(api, pod_namespace, "pods", manifest)

    def waiting() -> dict[str, str] | None:
        pod = read_pod(api, pod_namespace, "with-init")
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
        if statuses and "waiting" in statuses[0]["state"]:
            state: dict[str, str] = statuses[0]["state"]["waiting"]
            return state if state.get("message") else None
        return None

    state = wait_for(waiting, 30, "the pod to wait with a reason")
    assert state["reason"] == "CreateContainerConfigError"
    assert "initContainers not supported" in state["message"]


def test_a_pod_the_node_controller_marked_not_ready_is_marked_ready_again(
    local_cluster: LocalCluster, pod_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an API server restart the node controller marked a running pod `Ready: False`
    (its node missed heartbeats); a kubelet's status sync sets it again once the API holds
    another status than the one the node published. The local node did not, and the
    operator replaced the pod at the next recovery as one whose node stopped reporting."""
    monkeypatch.setattr(pod_worker, "STATUS_RECONCILE_SECONDS", 1.0)
    api = local_cluster.api
    create(api, pod_namespace, "pods", pod_manifest("steady", ["sh", "-c", "sleep 300"]))

    def ready() -> str | None:
        pod = read_pod(api, pod_namespace, "steady") or {}
        conditions = (pod.get("status") or {}).get("conditions") or []
        return next((c["status"] for c in conditions if c["type"] == "Ready"), None)

    wait_for(lambda: ready() == "True", 30, "the pod to be ready")
    mark = {
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "NodeNotReady"}]}
    }
    marked = api.request("PATCH", pod_path(pod_namespace, "steady") + "/status", mark,
                         content_type="application/strategic-merge-patch+json")  # fmt: skip
    held = {c["type"]: c["status"] for c in marked["status"]["conditions"]}
    assert (held["Ready"], held["ContainersReady"]) == ("False", "True"), held
    began = time.monotonic()
    wait_for(lambda: ready() == "True", 15, "the node to mark the pod ready again")
    print(f"ready again {time.monotonic() - began:.1f} s after the mark (reconcile every 1 s)")
