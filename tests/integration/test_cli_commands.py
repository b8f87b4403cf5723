"""`stabletrain` against the real control plane: status, history, manual rollback (once per
request id), suspend and resume, and the errors a person meets (missing job, no cluster,
RBAC denial), each a sentence on stderr and never a traceback.

The job's status is written through the status subresource with the api status models, as
the operator writes it; no operator runs here, so the tests that --wait play its part by
writing the phases it would go through. That the operator then carries out a manual
rollback exactly once is the operator's end-to-end test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from stabletrain_contract.checkpoint.inventory import CheckpointRecord, NodeCopy, TierCopy
from stabletrain_contract.directives import SkipRange
from stabletrain_contract.names import Action, AnomalyClass
from stabletrain_contract.trip_report import TripReport
from stabletrain_operator.api.constants import CRD_NAME, GROUP, PLURAL, VERSION, Phase
from stabletrain_operator.api.status import (
    Condition,
    Counters,
    RollbackRecord,
    StableTrainingJobStatus,
)
from stabletrain_operator.cli.main import main
from stabletrain_operator.generate.crds import CRD_PATH
from support.controlplane import ControlPlane, write_kubeconfig

REPO = Path(__file__).resolve().parents[2]
MINIMAL = REPO / "examples" / "manifests" / "minimal.yaml"
MERGE_PATCH = "application/merge-patch+json"
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture(scope="module")
def crd(control_plane: ControlPlane) -> str:
    applied = subprocess.run(
        control_plane.kubectl("apply", "--server-side", "-f", str(REPO / CRD_PATH)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    waited = subprocess.run(
        control_plane.kubectl(
            "wait", "--for=condition=Established", "--timeout=30s", f"crd/{CRD_NAME}"
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert waited.returncode == 0, waited.stderr
    return CRD_NAME


@pytest.fixture
def objects(api_client: client.ApiClient, crd: str) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


class Cli:
    """Runs `stabletrain` in this process against the test cluster, capturing both streams."""

    def __init__(self, plane: ControlPlane, namespace: str, capsys: pytest.CaptureFixture[str]):
        self.kubeconfig = str(plane.kubeconfig)
        self.namespace = namespace
        self._capsys = capsys

    def __call__(self, *args: str, kubeconfig: str | None = None) -> tuple[int, str, str]:
        code = main([*args, "--kubeconfig", kubeconfig or self.kubeconfig, "-n", self.namespace])
        captured = self._capsys.readouterr()
        assert "Traceback" not in captured.err
        return code, captured.out, captured.err


@pytest.fixture
def cli(
    control_plane: ControlPlane, namespace: str, crd: str, capsys: pytest.CaptureFixture[str]
) -> Cli:
    return Cli(control_plane, namespace, capsys)


def create_job(objects: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    body = yaml.safe_load(MINIMAL.read_text())
    body["metadata"] = {"name": name}
    created: dict[str, Any] = objects.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    return created


def write_status(
    objects: client.CustomObjectsApi, namespace: str, name: str, status: StableTrainingJobStatus
) -> None:
    """What the operator does: one write of the whole status through the subresource."""
    objects.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        {"status": status.model_dump(mode="json", by_alias=True, exclude_none=True)},
        _content_type=MERGE_PATCH,
    )


def read_job(objects: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    job: dict[str, Any] = objects.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return job


def checkpoint(step: int, *, pfs: bool, nodes: dict[str, bool]) -> CheckpointRecord:
    return CheckpointRecord(
        step=step,
        attempt=1,
        stable=True,
        saved_at=NOW - timedelta(minutes=10),
        pfs=TierCopy(complete=pfs, verified=pfs),
        local=tuple(
            NodeCopy(node=node, complete=True, verified=verified)
            for node, verified in nodes.items()
        ),
    )


RUNNING = StableTrainingJobStatus(
    phase=Phase.RUNNING,
    attempt=2,
    step=3510,
    loss=2.3125,
    loss_baseline=2.29,
    grad_norm=1.05,
    tokens_per_second=48210.0,
    lr_scale=0.5,
    active_skip_ranges=(SkipRange(first=2957, last=3257),),
    skip_ranges_total=1,
    checkpoints=(
        checkpoint(2500, pfs=True, nodes={"node-a": True, "node-b": True}),
        checkpoint(3000, pfs=True, nodes={"node-a": True, "node-b": True}),
        checkpoint(3500, pfs=False, nodes={"node-a": True, "node-b": False}),
    ),
    conditions=(
        Condition(
            type="Ready",
            status="True",
            last_transition_time=NOW - timedelta(minutes=3),
            reason="PodsRunning",
            message="2 of 2 worker pods run and report steps",
        ),
        Condition(
            type="Healthy",
            status="True",
            last_transition_time=NOW - timedelta(minutes=2),
            reason="RollbackConfirmed",
            message="passed the onset step 3007 without LossSpike firing",
        ),
    ),
    counters=Counters(rollbacks=1, restarts=1, trips=1),
    rollback_history=(
        RollbackRecord(
            time=NOW - timedelta(minutes=20),
            action=Action.RESTART_FROM_LATEST,
            rule="infrastructure",
            signal="WorkerFailure",
            anomaly_class=AnomalyClass.INFRASTRUCTURE,
            from_step=1204,
            to_step=1000,
            lr_scale=1.0,
            attempt=1,
        ),
        RollbackRecord(
            time=NOW - timedelta(minutes=5),
            action=Action.ROLLBACK,
            rule="loss-spike",
            signal="LossSpike",
            anomaly_class=AnomalyClass.BAD_BATCH,
            onset_step=3007,
            from_step=3010,
            to_step=2500,
            lr_scale=0.5,
            skipped=(SkipRange(first=2957, last=3257),),
            attempt=2,
        ),
    ),
    last_trip=TripReport(
        attempt=1,
        node="node-a",
        step=3010,
        tripped_at=NOW - timedelta(minutes=5),
        signal="LossSpike",
        anomaly_class=AnomalyClass.BAD_BATCH,
        evidence="loss 5.1 vs healthy baseline 2.2 = 2.32x, 4 step(s) since step 3007",
        onset_step=3007,
        last_good_step=3006,
    ),
)


def test_status_lists_jobs_and_shows_one_in_detail(
    cli: Cli, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_job(objects, namespace, "gpt-a")
    create_job(objects, namespace, "gpt-b")
    write_status(objects, namespace, "gpt-a", RUNNING)

    code, out, _ = cli("status")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "NAME",
        "PHASE",
        "STEP",
        "LOSS",
        "LR",
        "SCALE",
        "ROLLBACKS",
        "RESTARTS",
        "AGE",
    ]
    assert lines[1].split()[:7] == ["gpt-a", "Running", "3510", "2.312", "0.5", "1", "1"]
    assert lines[2].split()[:7] == ["gpt-b", "Pending", "-", "-", "1", "0", "0"]

    code, out, _ = cli("status", "gpt-a")
    assert code == 0
    assert "Phase:        Running" in out
    assert "Step:         3510" in out
    assert "Loss:         2.312 (healthy baseline 2.29)" in out
    assert "LR scale:     0.5" in out
    assert "Skip ranges:  steps 2957-3257" in out
    assert "Rollbacks:    1 of 5" in out
    checkpoint_rows = [line.split() for line in out.splitlines() if line.strip()[:4].isdigit()]
    assert checkpoint_rows == [
        ["2500", "1", "yes", "verified", "verified", "verified"],
        ["3000", "1", "yes", "verified", "verified", "verified"],
        ["3500", "1", "yes", "partial", "verified", "complete"],
    ]
    assert "LOCAL node-a  LOCAL node-b" in out
    assert "Healthy  True    RollbackConfirmed" in out

    code, out, _ = cli("status", "-A")
    assert code == 0
    assert f"{namespace}  gpt-a" in out


def test_history_shows_rollbacks_restarts_and_the_evidence(
    cli: Cli, objects: client.CustomObjectsApi, namespace: str, api_client: client.ApiClient
) -> None:
    job = create_job(objects, namespace, "gpt-h")
    write_status(objects, namespace, "gpt-h", RUNNING)
    client.CoreV1Api(api_client).create_namespaced_event(
        namespace,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"gpt-h.{uuid.uuid4().hex[:8]}"),
            involved_object=client.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}",
                kind="StableTrainingJob",
                name="gpt-h",
                namespace=namespace,
                uid=job["metadata"]["uid"],
            ),
            reason="RollbackStarted",
            message="rule loss-spike rolls back on LossSpike (BadBatch) at step 3010",
            type="Warning",
            first_timestamp=NOW - timedelta(minutes=5),
            last_timestamp=NOW - timedelta(minutes=5),
            source=client.V1EventSource(component="stabletrain-operator"),
        ),
    )
    code, out, _ = cli("history", "gpt-h")
    assert code == 0
    rows = {line.split()[1]: line.split() for line in out.splitlines() if "m  " in line[:8]}
    assert rows["Rollback"][2:11] == [
        "loss-spike",
        "LossSpike",
        "BadBatch",
        "3007",
        "3010",
        "2500",
        "0.5",
        "steps",
        "2957-3257",
    ]
    assert rows["RestartFromLatest"][2:8] == [
        "infrastructure",
        "WorkerFailure",
        "Infrastructure",
        "-",
        "1204",
        "1000",
    ]
    assert "Last trip: LossSpike (BadBatch) at step 3010 on node node-a, onset 3007" in out
    assert "evidence: loss 5.1 vs healthy baseline 2.2 = 2.32x" in out
    assert "Warning  RollbackStarted  rule loss-spike rolls back on LossSpike (BadBatch)" in out


def test_rollback_runs_once_per_request_id(
    cli: Cli, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_job(objects, namespace, "gpt-r")
    code, out, _ = cli(
        "rollback", "gpt-r", "--to-step", "3000", "--request-id", "fix-1", "--reason", "bad shard"
    )
    assert code == 0
    assert "manual rollback fix-1 of gpt-r requested (to step <= 3000)" in out
    job = read_job(objects, namespace, "gpt-r")
    assert job["spec"]["manualRollback"] == {
        "requestId": "fix-1",
        "toStep": 3000,
        "reason": "bad shard",
        "skip": [],
    }
    generation = job["metadata"]["generation"]

    code, out, _ = cli("rollback", "gpt-r", "--to-step", "3000", "--request-id", "fix-1")
    assert code == 0
    assert "fix-1 of gpt-r was already requested; nothing written" in out
    assert read_job(objects, namespace, "gpt-r")["metadata"]["generation"] == generation

    code, _, err = cli("rollback", "gpt-r", "--to-step", "2000")
    assert code == 1
    assert "manual rollback fix-1 of gpt-r is still pending" in err

    write_status(
        objects, namespace, "gpt-r", StableTrainingJobStatus(last_manual_request_id="fix-1")
    )
    code, out, _ = cli("rollback", "gpt-r", "--to-step", "3000", "--request-id", "fix-1")
    assert "already requested" in out, "a handled id stays handled"
    code, out, _ = cli("rollback", "gpt-r", "--to-step", "2000", "--lr-factor", "0.5")
    assert code == 0
    fresh = out.split()[2]
    assert fresh.startswith("rb-")
    request = read_job(objects, namespace, "gpt-r")["spec"]["manualRollback"]
    assert request == {
        "requestId": fresh,
        "toStep": 2000,
        "lrFactor": 0.5,
        "skip": [],
        "reason": "",
    }, "nothing of the earlier request (its reason) leaks into the new one"


def play_operator(
    objects: client.CustomObjectsApi,
    namespace: str,
    name: str,
    steps: list[StableTrainingJobStatus],
) -> threading.Thread:
    """Writes the phases the operator would go through, half a second apart."""

    def run() -> None:
        for status in steps:
            time.sleep(0.5)
            write_status(objects, namespace, name, status)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_rollback_wait_follows_the_operator_until_running(
    cli: Cli, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_job(objects, namespace, "gpt-w")
    write_status(
        objects,
        namespace,
        "gpt-w",
        StableTrainingJobStatus(phase=Phase.RUNNING, attempt=1, step=900),
    )
    operator = play_operator(
        objects,
        namespace,
        "gpt-w",
        [
            StableTrainingJobStatus(phase=Phase.STOPPING, attempt=1, step=905),
            StableTrainingJobStatus(phase=Phase.PLANNING, attempt=1, step=905),
            StableTrainingJobStatus(
                phase=Phase.RUNNING, attempt=2, step=500, last_manual_request_id="w-1"
            ),
        ],
    )
    code, out, err = cli(
        "rollback", "gpt-w", "--to-step", "500", "--request-id", "w-1", "--wait", "--timeout", "30"
    )
    operator.join(timeout=30)
    assert code == 0, err
    assert "requested" in out
    progress = [line.strip() for line in err.splitlines() if line.startswith("  gpt-w:")]
    assert progress[0] == "gpt-w: Running (attempt 1, step 900)"
    assert progress[-1] == "gpt-w: Running (attempt 2, step 500)"
    assert "gpt-w runs again from attempt 2" in err


def test_wait_times_out_with_a_hint(
    cli: Cli, objects: client.CustomObjectsApi, namespace: str
) -> None:
    create_job(objects, namespace, "gpt-t")
    code, _, err = cli("suspend", "gpt-t", "--wait", "--timeout", "1.5")
    assert code == 1
    assert "timed out after 1.5 s waiting for phase Suspended (phase Pending)" in err
    assert "is the operator running?" in err


def test_suspend_and_resume(cli: Cli, objects: client.CustomObjectsApi, namespace: str) -> None:
    create_job(objects, namespace, "gpt-s")
    code, out, _ = cli("suspend", "gpt-s")
    assert (code, out.strip()) == (0, "gpt-s: suspend requested")
    assert read_job(objects, namespace, "gpt-s")["spec"]["suspend"] is True
    code, out, _ = cli("suspend", "gpt-s")
    assert out.strip() == "gpt-s is already suspended; nothing written"

    operator = play_operator(
        objects, namespace, "gpt-s", [StableTrainingJobStatus(phase=Phase.SUSPENDED)]
    )
    code, _, err = cli("suspend", "gpt-s", "--wait", "--timeout", "30")
    operator.join(timeout=30)
    assert code == 0, err
    assert "gpt-s: Suspended" in err

    code, out, _ = cli("resume", "gpt-s")
    assert (code, out.strip()) == (0, "gpt-s: resume requested")
    assert read_job(objects, namespace, "gpt-s")["spec"]["suspend"] is False
    code, out, _ = cli("resume", "gpt-s")
    assert out.strip() == "gpt-s is already not suspended; nothing written"


def test_missing_job_and_empty_namespace(cli: Cli) -> None:
    for command in (
        ["status", "ghost"],
        ["history", "ghost"],
        ["suspend", "ghost"],
        ["rollback", "ghost", "--to-step", "1"],
    ):
        code, out, err = cli(*command)
        assert code == 1, command
        assert (
            f"stabletrain: error: StableTrainingJob 'ghost' not found in namespace {cli.namespace}"
            in err
        )
        assert out == ""
    code, out, err = cli("status")
    assert (code, out) == (0, "")
    assert f"no StableTrainingJobs in namespace {cli.namespace}" in err


def test_no_cluster(cli: Cli, tmp_path: Path) -> None:
    code, _, err = cli("status", kubeconfig=str(tmp_path / "absent.kubeconfig"))
    assert code == 1
    assert "no cluster configured: kubeconfig" in err
    dead = tmp_path / "dead.kubeconfig"
    text = Path(cli.kubeconfig).read_text()
    server = next(line.split()[-1] for line in text.splitlines() if "server:" in line)
    dead.write_text(text.replace(server, "https://127.0.0.1:9"))
    started = time.monotonic()
    code, _, err = cli("status", kubeconfig=str(dead))
    assert code == 1
    assert "cannot reach the Kubernetes API server at https://127.0.0.1:9" in err
    assert "Connection refused" in err
    assert time.monotonic() - started < 10
    garbage = tmp_path / "garbage.kubeconfig"
    garbage.write_text("this: [is not a kubeconfig")
    code, _, err = cli("status", kubeconfig=str(garbage))
    assert code == 1
    assert "garbage.kubeconfig" in err


def test_rbac_denial_is_explained(
    cli: Cli,
    objects: client.CustomObjectsApi,
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tmp_path: Path,
) -> None:
    namespace = cli.namespace
    create_job(objects, namespace, "gpt-x")
    user = f"viewer-{uuid.uuid4().hex[:6]}"
    pair = control_plane.ca.issue(user, user)
    kubeconfig = tmp_path / "viewer.kubeconfig"
    write_kubeconfig(kubeconfig, control_plane.server, control_plane.ca.cert_path, pair, user)

    code, _, err = cli("status", "gpt-x", kubeconfig=str(kubeconfig))
    assert code == 1
    assert f"permission denied: cannot get StableTrainingJob {namespace}/gpt-x" in err
    assert f'User "{user}" cannot get resource "stabletrainingjobs"' in err

    rbac = client.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="stj-reader"),
            rules=[
                client.V1PolicyRule(api_groups=[GROUP], resources=[PLURAL], verbs=["get", "list"])
            ],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="stj-reader"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="stj-reader"
            ),
            subjects=[
                client.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")
            ],
        ),
    )
    deadline = time.monotonic() + 10
    while (code := cli("status", "gpt-x", kubeconfig=str(kubeconfig))[0]) != 0:
        assert time.monotonic() < deadline, "the Role never took effect"
        time.sleep(0.2)
    code, out, err = cli("history", "gpt-x", kubeconfig=str(kubeconfig))
    assert code == 0
    assert "note: Events not shown: permission denied" in err
    assert "no rollbacks or restarts" in out
    code, _, err = cli("suspend", "gpt-x", kubeconfig=str(kubeconfig))
    assert code == 1
    assert f"permission denied: cannot patch StableTrainingJob {namespace}/gpt-x" in err


def test_kubectl_finds_the_plugin(control_plane: ControlPlane, crd: str, namespace: str) -> None:
    env = control_plane.env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    listed = subprocess.run(
        [str(control_plane.bin_dir / "kubectl"), "stabletrain", "status", "-n", namespace],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert f"no StableTrainingJobs in namespace {namespace}" in listed.stderr


def test_rejected_credentials(cli: Cli, control_plane: ControlPlane, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "token.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": control_plane.server,
                            "certificate-authority": str(control_plane.ca.cert_path),
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "not-a-valid-token"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    code, _, err = cli("status", kubeconfig=str(kubeconfig))
    assert code == 1
    assert f"the API server at {control_plane.server} rejected the credentials" in err
