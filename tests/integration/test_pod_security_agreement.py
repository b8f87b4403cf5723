"""The operator's Pod Security checks agree with Kubernetes' own: every template below is
built into the worker pod the operator would create and sent, as a server-side dry run, to
namespaces whose PodSecurity admission enforces baseline and restricted. A pod the
operator's check passes is admitted, one it refuses is denied, at both levels."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stabletrain_operator import pods
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.tenancy.limits import PodSecurityLevel
from stabletrain_operator.tenancy.pod_security import violations

Json = dict[str, Any]
LEVELS = (PodSecurityLevel.BASELINE, PodSecurityLevel.RESTRICTED)
HARDENED: Json = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def trainer(context: Json | None = None, **fields: Any) -> Json:
    container: Json = {"name": "trainer", "image": "train", "command": ["torchrun", "t.py"]}
    if context is not None:
        container["securityContext"] = context
    return {**container, **fields}


def template(*containers: Json, **pod: Any) -> Json:
    return {"spec": {"containers": list(containers) or [trainer()], **pod}}


TEMPLATES: dict[str, Json] = {
    "plain": template(),
    "hardened": template(trainer(HARDENED)),
    "hardened, NET_BIND_SERVICE": template(
        trainer({**HARDENED, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}})
    ),
    "hardened at the pod": template(
        trainer({"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}),
        securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    ),
    "hostNetwork": template(hostNetwork=True),
    "hostPID": template(hostPID=True),
    "privileged": template(trainer({"privileged": True})),
    "SYS_ADMIN": template(trainer({"capabilities": {"add": ["SYS_ADMIN"]}})),
    "CHOWN": template(trainer({"capabilities": {"add": ["CHOWN"]}})),
    "hostPath volume": template(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
    "nfs volume": template(trainer(HARDENED),
                           volumes=[{"name": "n", "nfs": {"server": "s", "path": "/"}}]),
    "hostPort": template(trainer(ports=[{"containerPort": 8080, "hostPort": 8080}])),
    "probe of a host": template(
        trainer(livenessProbe={"tcpSocket": {"host": "10.0.0.1", "port": 22}})
    ),
    "unconfined seccomp": template(securityContext={"seccompProfile": {"type": "Unconfined"}}),
    "unsafe sysctl": template(securityContext={"sysctls": [{"name": "kernel.msgmax",
                                                             "value": "65536"}]}),
    "safe sysctl": template(securityContext={"sysctls": [{"name": "net.ipv4.tcp_rmem",
                                                           "value": "4096 87380 6291456"}]}),
    "SELinux role": template(securityContext={"seLinuxOptions": {"role": "sysadm_r"}}),
    "unmasked proc": template(trainer({"procMount": "Unmasked"}), hostUsers=False),
    "runs as root": template(trainer({**HARDENED, "runAsUser": 0})),
    "escalation allowed": template(trainer({**HARDENED, "allowPrivilegeEscalation": True})),
}  # fmt: skip


def _namespace(core: Any, level: PodSecurityLevel) -> str:
    name = f"psa-{level}-{uuid.uuid4().hex[:8]}"
    labels = {
        "pod-security.kubernetes.io/enforce": str(level),
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # admission refuses pods before the default account
        try:
            core.read_namespaced_service_account("default", name)
            return name
        except ApiException as error:
            if error.status != 404:
                raise
        time.sleep(0.1)
    raise RuntimeError(f"namespace {name}: no default ServiceAccount after 30 s")


@pytest.fixture(scope="module")
def enforcing(api_client: client.ApiClient) -> Iterator[dict[PodSecurityLevel, str]]:
    core: Any = client.CoreV1Api(api_client)
    namespaces = {level: _namespace(core, level) for level in LEVELS}
    yield namespaces
    for name in namespaces.values():
        core.delete_namespace(name)


def admitted(core: Any, pod: Json) -> bool:
    """The API server's verdict: admitted, or denied by PodSecurity (any other refusal is a
    fault of the test, raised as it is)."""
    try:
        core.create_namespaced_pod(pod["metadata"]["namespace"], pod, dry_run="All")
    except ApiException as error:
        if error.status == 403 and "violates PodSecurity" in str(error.body):
            return False
        raise
    return True


@pytest.mark.parametrize("level", LEVELS, ids=str)
def test_the_operators_verdict_is_the_api_servers(
    api_client: client.ApiClient, enforcing: dict[PodSecurityLevel, str], level: PodSecurityLevel
) -> None:
    core: Any = client.CoreV1Api(api_client)
    verdicts = {}
    for what, pod_template in TEMPLATES.items():
        spec = StableTrainingJobSpec.model_validate({
            "workers": {"nodes": 1, "template": pod_template},
            "checkpoints": {"local": {"volume": {"emptyDir": {}}}, "pfs": {"claimName": "pfs"}},
        })  # fmt: skip
        job = pods.JobRef("psa", enforcing[level], "uid-1")
        ours = not violations(pod_template, level)
        theirs = admitted(core, pods.build_pod(spec, job, 0, 0))
        verdicts[what] = (ours, theirs)
    disagree = {what: v for what, v in verdicts.items() if v[0] != v[1]}
    assert disagree == {}, f"(operator, API server) verdicts at {level}: {disagree}"
    assert {ours for ours, _ in verdicts.values()} == {True, False}, "both verdicts occur"
