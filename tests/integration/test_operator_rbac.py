"""The operator authenticated as a ServiceAccount with exactly the RBAC docs/operator.md
lists (what the chart's Role must grant) runs a job to success and through a rollback."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from support.controlplane import ControlPlane
from support.operator import Jobs, job_manifest, running_operator

CLUSTER_RULES = [
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
     "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["stabletrain.dev"], "resources": ["stabletrainingpolicies"], "verbs": ["list"]},
]  # fmt: skip
NAMESPACE_RULES = [
    {"apiGroups": ["stabletrain.dev"], "resources": ["stabletrainingjobs"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["stabletrain.dev"], "resources": ["stabletrainingjobs/status"],
     "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
     "verbs": ["get", "create", "update"]},
]  # fmt: skip


def _service_account_kubeconfig(
    plane: ControlPlane, api_client: client.ApiClient, namespace: str, path: Path
) -> Path:
    core: Any = client.CoreV1Api(api_client)
    rbac: Any = client.RbacAuthorizationV1Api(api_client)
    name = "stabletrain-operator"
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
    cluster_name = f"stabletrain-operator-{uuid.uuid4().hex[:8]}"
    rbac.create_cluster_role({"metadata": {"name": cluster_name}, "rules": CLUSTER_RULES})
    rbac.create_cluster_role_binding({
        "metadata": {"name": cluster_name}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": cluster_name},
    })  # fmt: skip
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": NAMESPACE_RULES})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": name}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
    })  # fmt: skip
    token = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": plane.server,
                                                "certificate-authority": str(plane.ca.cert_path)}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa",
                                                 "namespace": namespace}}],
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


def test_operator_needs_no_more_than_the_documented_rbac(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    jobs: Jobs,
    tmp_path: Path,
) -> None:
    kubeconfig = _service_account_kubeconfig(
        control_plane, api_client, jobs.namespace, tmp_path / "sa.kubeconfig"
    )
    rules = [{"name": "nan", "onSignals": ["NonFinite"], "action": "Rollback",
              "rollback": {"minStepsBeforeOnset": 5, "rewarmupSteps": 2}}]  # fmt: skip
    worker = {"ST_STEPS": "30", "ST_STEP_SECONDS": "0.1", "ST_CKPT_EVERY": "5", "ST_NAN_AT": "17"}
    with running_operator(
        control_plane, api_client, jobs.namespace, tmp_path / "operator.log",
        {"KUBECONFIG": str(kubeconfig)},
    ) as operator:  # fmt: skip
        jobs.create(job_manifest("rbac", worker, recovery={"rules": rules}))
        done = jobs.wait("rbac", lambda s: s.get("phase") == "Succeeded", 150, "success")
        log = operator.log()
    assert done["counters"]["rollbacks"] == 1
    assert done["attempt"] == 1
    # Without each line's date and time: a time of day can end in ",403" milliseconds.
    messages = "\n".join(line.split(" ", 2)[-1] for line in log.splitlines())
    assert "403" not in messages, log[-2000:]
    assert "Forbidden" not in messages, log[-2000:]
    assert any(e["reason"] == "RollbackConfirmed" for e in jobs.events("rbac"))
