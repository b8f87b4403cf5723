"""The proof that the chart's RBAC is sufficient: the real operator (`python -m
stabletrain_operator`, as the chart's Deployment runs it), with nothing but the chart's
ServiceAccount token in its kubeconfig, carries out a full NaN rollback of a job whose pods
the local node runs: trip, stop every pod, plan from the inventory, relaunch with the new
directives, confirm, succeed.

The fault is a sustained loss spike (the contract worker's ST_SPIKE_AT): a NaN trip would
exercise the same calls, but its report carries a non-finite value, which the operator
cannot write into status yet (a NaN in the JSON body: 400 Bad Request, also without this
chart; see the operator's own NaN test).

The release is namespaced (a Role in the job's namespace, nothing cluster-wide), the
strictest mode: the operator turns kopf's cluster scanning off when given namespaces, so it
asks for nothing cluster-wide and is refused nothing.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from support.chart import CHART, helm
from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess, job_manifest, running_operator
from support.serviceaccount import ServiceAccountClient, service_account_kubeconfig

ROLLBACK = {
    "minStepsBeforeOnset": 5,
    "skipStepsBeforeOnset": 2,
    "skipStepsAfterOnset": 5,
    "rewarmupSteps": 3,
}
RULES = [{"name": "spike", "onSignals": ["LossSpike"], "action": "Rollback", "rollback": ROLLBACK}]


@pytest.fixture
def chart_account(
    control_plane: ControlPlane, api_client: client.ApiClient, job_namespace: str, tmp_path: Path
) -> Iterator[ServiceAccountClient]:
    """The chart installed in its own namespace, serving only the job's namespace."""
    core = client.CoreV1Api(api_client)
    release_ns = f"t-op-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=release_ns)))
    env = control_plane.env()
    for kind in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{kind}_HOME"] = str(tmp_path / f"helm-{kind.lower()}")
    name = f"o{uuid.uuid4().hex[:6]}"
    try:
        installed = helm(
            "install", name, str(CHART), "-n", release_ns,
            "--set", f"watchNamespaces={{{job_namespace}}}", env=env,
        )  # fmt: skip
        assert installed.returncode == 0, installed.stderr
        yield service_account_kubeconfig(
            control_plane, release_ns, f"{name}-stabletrain", tmp_path / "operator.kubeconfig"
        )
    finally:
        helm("uninstall", name, "-n", release_ns, "--wait", env=env)
        core.delete_namespace(release_ns)


@pytest.fixture
def chart_operator(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    job_namespace: str,
    chart_account: ServiceAccountClient,
    tmp_path: Path,
) -> Iterator[OperatorProcess]:
    env = {"KUBECONFIG": str(chart_account.kubeconfig)}
    log = tmp_path / "operator.log"
    with running_operator(control_plane, api_client, job_namespace, log, env) as operator:
        yield operator


def process_environment(pid: int, timeout: float = 10.0) -> dict[str, str]:
    """The environment of `pid` once it runs the operator: read while the process is still
    exec'ing (setpriv, then python), /proc/<pid>/environ can come back empty."""
    deadline = time.monotonic() + timeout
    while True:
        running = b"stabletrain_operator" in Path(f"/proc/{pid}/cmdline").read_bytes()
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        pairs = [item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item]
        if (running and pairs) or time.monotonic() > deadline:
            return dict(pairs)
        time.sleep(0.05)


def test_operator_with_the_chart_service_account_rolls_a_job_back(
    chart_operator: OperatorProcess,
    chart_account: ServiceAccountClient,
    jobs: Jobs,
    local_cluster: LocalCluster,
) -> None:
    # Who the operator is: only the ServiceAccount's token, never the admin's certificate.
    assert chart_operator.process is not None
    environment = process_environment(chart_operator.process.pid)
    assert environment["KUBECONFIG"] == str(chart_account.kubeconfig)
    whoami = subprocess.run(
        chart_account.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"),
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert whoami.stdout == chart_account.username, whoami.stderr
    assert "client-certificate" not in chart_account.kubeconfig.read_text()

    env = {
        "ST_STEP_SECONDS": "0.1", "ST_CKPT_EVERY": "5", "ST_STEPS": "35",
        "ST_SPIKE_AT": "17", "ST_SPIKE_LEN": "6",
    }  # fmt: skip
    jobs.create(job_manifest("rbac", env, recovery={"rules": RULES}))
    try:
        done = jobs.wait("rbac", lambda s: s.get("phase") == "Succeeded", 150, "the job to heal")
    except AssertionError as error:
        tail = "\n".join(chart_operator.log().splitlines()[-60:])
        raise AssertionError(f"{error}\noperator log (last 60 lines):\n{tail}") from None

    (entry,) = done["rollbackHistory"]
    assert entry["signal"] == "LossSpike"
    assert entry["onsetStep"] == 17
    assert entry["toStep"] == 10, "the newest checkpoint at least 5 steps before the onset"
    assert entry["lrScale"] == 0.5
    assert done["attempt"] == 1
    assert done["counters"]["rollbacks"] == 1
    exposed = chart_operator.metrics()
    budget = r'budget_remaining\{kind="(\w+)",stabletrain_job="rbac",[^}]*\} (\S+)'
    remaining = dict(re.findall(budget, exposed))
    assert remaining == {"rollback": "4.0", "restart": "10.0"}, [  # defaults 5 and 10
        line for line in exposed.splitlines() if "budget" in line
    ]
    directives = jobs.config_map("rbac-a1-directives")["data"]["directives.json"]
    assert '"resumeStep":10' in directives.replace(" ", "")
    reasons = [e["reason"] for e in jobs.events("rbac")]
    for earlier, later in [
        ("RollbackStarted", "Planned"),
        ("Planned", "Relaunched"),
        ("Relaunched", "RollbackConfirmed"),
        ("RollbackConfirmed", "TrainingComplete"),
    ]:
        assert reasons.index(earlier) < reasons.index(later), reasons

    # Nothing was refused on the way: no cluster-wide namespace or CRD listing either.
    log = chart_operator.log()
    assert "Falling back to a list of namespaces" not in log
    refusals = [line for line in log.splitlines() if "forbidden" in line.lower() or " 403" in line]
    assert refusals == [], "\n".join(refusals)
    print(f"rollback as {chart_account.username}: {entry}; events {reasons}")
