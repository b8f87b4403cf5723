"""The Pod Security Standards over a worker template: each check of Kubernetes v1.34's
PodSecurity admission, the field it names, and what each level lets through.
(tests/integration/test_hostile_tenant.py sends the same templates to a real API server's
PodSecurity admission and compares the verdicts.)"""

from __future__ import annotations

from typing import Any

import pytest

from stabletrain_operator.tenancy.limits import PodSecurityLevel
from stabletrain_operator.tenancy.pod_security import violations

BASELINE, RESTRICTED = PodSecurityLevel.BASELINE, PodSecurityLevel.RESTRICTED
Json = dict[str, Any]
RESTRICTED_CONTEXT: Json = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def template(container: Json | None = None, **pod: Any) -> Json:
    trainer = {"name": "trainer", "image": "train", **(container or {})}
    return {"spec": {"containers": [trainer], **pod}}


def restricted(container: Json | None = None, **pod: Any) -> Json:
    context = {**RESTRICTED_CONTEXT, **(container or {}).pop("securityContext", {})}
    return template({**(container or {}), "securityContext": context}, **pod)


BASELINE_BREACHES: list[tuple[str, Json, str]] = [
    ("host network", template(hostNetwork=True), "spec.hostNetwork"),
    ("host PID", template(hostPID=True), "spec.hostPID"),
    ("host IPC", template(hostIPC=True), "spec.hostIPC"),
    ("privileged", template({"securityContext": {"privileged": True}}),
     "spec.containers[0].securityContext.privileged"),
    ("SYS_ADMIN", template({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
     "spec.containers[0].securityContext.capabilities.add"),
    ("hostPath volume", template(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
     "spec.volumes[0].hostPath"),
    ("host port", template({"ports": [{"containerPort": 80, "hostPort": 80}]}),
     "spec.containers[0].ports[0].hostPort"),
    ("probe of another host",
     template({"livenessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}}}),
     "spec.containers[0].livenessProbe.httpGet.host"),
    ("AppArmor unconfined",
     template({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}),
     "spec.containers[0].securityContext.appArmorProfile.type"),
    ("SELinux user", template(securityContext={"seLinuxOptions": {"user": "root"}}),
     "spec.securityContext.seLinuxOptions.user"),
    ("unmasked /proc", template({"securityContext": {"procMount": "Unmasked"}}),
     "spec.containers[0].securityContext.procMount"),
    ("seccomp unconfined",
     template(securityContext={"seccompProfile": {"type": "Unconfined"}}),
     "spec.securityContext.seccompProfile.type"),
    ("kernel sysctl", template(securityContext={"sysctls": [{"name": "kernel.msgmax",
                                                             "value": "1"}]}),
     "spec.securityContext.sysctls[0].name"),
    ("init container privileged",
     {"spec": {"containers": [{"name": "trainer"}],
               "initContainers": [{"name": "setup", "securityContext": {"privileged": True}}]}},
     "spec.initContainers[0].securityContext.privileged"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "pod", "field"), BASELINE_BREACHES)
def test_baseline_names_the_field_of_each_breach(what: str, pod: Json, field: str) -> None:
    found = violations(pod, BASELINE)
    assert [v.field for v in found] == [field], (what, found)
    assert violations(pod, PodSecurityLevel.PRIVILEGED) == []


def test_baseline_lets_an_ordinary_training_template_through() -> None:
    pod = template(
        {"securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"]}},
         "ports": [{"containerPort": 29400}],
         "readinessProbe": {"httpGet": {"port": 9400}}},
        securityContext={"seccompProfile": {"type": "RuntimeDefault"},
                         "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]},
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        serviceAccountName="trainer",
    )  # fmt: skip
    assert violations(pod, BASELINE) == []


RESTRICTED_BREACHES: list[tuple[str, Json, str]] = [
    ("no settings at all", template(),
     "spec.containers[0].securityContext.allowPrivilegeEscalation"),
    ("privilege escalation", restricted({"securityContext": {"allowPrivilegeEscalation": True}}),
     "spec.containers[0].securityContext.allowPrivilegeEscalation"),
    ("root allowed", restricted({"securityContext": {"runAsNonRoot": False}}),
     "spec.containers[0].securityContext.runAsNonRoot"),
    ("UID 0", restricted(securityContext={"runAsUser": 0}), "spec.securityContext.runAsUser"),
    ("capabilities kept", restricted({"securityContext": {"capabilities": {}}}),
     "spec.containers[0].securityContext.capabilities.drop"),
    ("capability added", restricted({"securityContext": {"capabilities": {
        "drop": ["ALL"], "add": ["CHOWN"]}}}),
     "spec.containers[0].securityContext.capabilities.add"),
    ("no seccomp", restricted({"securityContext": {"seccompProfile": None}}),
     "spec.containers[0].securityContext.seccompProfile.type"),
    ("NFS volume", restricted(volumes=[{"name": "x", "nfs": {"server": "s", "path": "/"}}]),
     "spec.volumes[0]"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "pod", "field"), RESTRICTED_BREACHES)
def test_restricted_names_the_field_of_each_breach(what: str, pod: Json, field: str) -> None:
    fields = [v.field for v in violations(pod, RESTRICTED)]
    assert field in fields, (what, fields)


def test_restricted_lets_a_hardened_template_through() -> None:
    pod = restricted(
        {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}},
        volumes=[{"name": "scratch", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}],
    )
    assert violations(pod, RESTRICTED) == []


def test_restricted_replaces_the_baseline_checks_it_tightens() -> None:
    """A hostPath volume is one restricted-volume finding, not also a baseline one."""
    pod = restricted(volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    assert [v.field for v in violations(pod, RESTRICTED)] == ["spec.volumes[0]"]


def test_windows_pods_are_exempt_where_kubernetes_exempts_them() -> None:
    pod = template(os={"name": "windows"}, securityContext={"runAsNonRoot": True})
    assert violations(pod, RESTRICTED) == []


def test_a_template_of_the_wrong_shape_is_judged_without_raising() -> None:
    pod = {"spec": {"containers": ["x", {"name": "t", "securityContext": "privileged"}],
                    "volumes": "none", "securityContext": ["odd"]}}  # fmt: skip
    assert violations(pod, BASELINE) == []
