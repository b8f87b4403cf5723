"""The Kubernetes Pod Security Standards (baseline, restricted) over a pod template as JSON.

The same checks, with the same allowed values, as Kubernetes v1.34's PodSecurity admission
(k8s.io/pod-security-admission, policy/check_*.go at their newest version), so a template
this module passes is one a namespace enforcing the level admits, and each violation names
the field. The operator runs them on the worker template before it creates any pod, so a
job is refused with the reason instead of failing pod by pod (or, where the namespace
enforces nothing, running what the administrator did not allow).

Windows pods are exempt from the checks Kubernetes exempts them from. The alpha relaxation
for pods in user namespaces (feature gate UserNamespacesPodSecurityStandards, off by
default) is not applied: the checks stay as strict as a default cluster's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from stabletrain_operator.tenancy.limits import PodSecurityLevel

Json = Mapping[str, Any]

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
PROFILE_TYPES = frozenset({"RuntimeDefault", "Localhost"})
"""Allowed seccomp and AppArmor profile types."""
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


@dataclass(frozen=True)
class Violation:
    field: str
    """Path inside the pod template (`spec.containers[0].securityContext.privileged`)."""
    message: str


def _map(value: object) -> Json:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class _Container:
    path: str
    name: str
    body: Json

    @property
    def context(self) -> Json:
        return _map(self.body.get("securityContext"))

    def field(self, *names: str) -> str:
        return ".".join((self.path, "securityContext", *names))


class _Pod:
    def __init__(self, template: Json) -> None:
        self.metadata = _map(template.get("metadata"))
        self.spec = _map(template.get("spec"))
        self.context = _map(self.spec.get("securityContext"))
        self.windows = _map(self.spec.get("os")).get("name") == "windows"

    def containers(self) -> Iterator[_Container]:
        for kind in CONTAINER_LISTS:
            for index, body in enumerate(_list(self.spec.get(kind))):
                if isinstance(body, Mapping):
                    name = str(body.get("name", index))
                    yield _Container(f"spec.{kind}[{index}]", name, body)


Check = Callable[[_Pod], list[Violation]]


def _host_process(pod: _Pod) -> list[Violation]:
    found = []
    if _map(pod.context.get("windowsOptions")).get("hostProcess") is True:
        found.append(
            Violation(
                "spec.securityContext.windowsOptions.hostProcess",
                "the pod must not be a Windows HostProcess pod",
            )
        )
    for c in pod.containers():
        if _map(c.context.get("windowsOptions")).get("hostProcess") is True:
            found.append(
                Violation(
                    c.field("windowsOptions", "hostProcess"),
                    f"container {c.name!r} must not be a HostProcess container",
                )
            )
    return found


def _host_namespaces(pod: _Pod) -> list[Violation]:
    return [
        Violation(f"spec.{key}", f"{key}=true shares the node's namespace")
        for key in ("hostNetwork", "hostPID", "hostIPC")
        if pod.spec.get(key) is True
    ]


def _privileged(pod: _Pod) -> list[Violation]:
    return [
        Violation(c.field("privileged"), f"container {c.name!r} must not be privileged")
        for c in pod.containers()
        if c.context.get("privileged") is True
    ]


def _added(container: _Container) -> list[str]:
    return [str(cap) for cap in _list(_map(container.context.get("capabilities")).get("add"))]


def _capabilities_baseline(pod: _Pod) -> list[Violation]:
    found = []
    for c in pod.containers():
        extra = sorted(set(_added(c)) - BASELINE_CAPABILITIES)
        if extra:
            found.append(
                Violation(
                    c.field("capabilities", "add"),
                    f"container {c.name!r} must not add {', '.join(extra)}",
                )
            )
    return found


def _host_path_volumes(pod: _Pod) -> list[Violation]:
    return [
        Violation(
            f"spec.volumes[{i}].hostPath", f"volume {_map(v).get('name')!r} is a hostPath volume"
        )
        for i, v in enumerate(_list(pod.spec.get("volumes")))
        if "hostPath" in _map(v)
    ]


def _host_ports(pod: _Pod) -> list[Violation]:
    found = []
    for c in pod.containers():
        for index, port in enumerate(_list(c.body.get("ports"))):
            host_port = _map(port).get("hostPort")
            if host_port not in (None, 0):
                found.append(
                    Violation(
                        f"{c.path}.ports[{index}].hostPort",
                        f"container {c.name!r} must not use hostPort {host_port}",
                    )
                )
    return found


def _hosts(handler: object) -> list[tuple[str, str]]:
    """(subfield, host) of an httpGet or tcpSocket that names a host."""
    body = _map(handler)
    return [
        (kind, str(host))
        for kind in ("httpGet", "tcpSocket")
        if (host := _map(body.get(kind)).get("host"))
    ]


def _probe_hosts(pod: _Pod) -> list[Violation]:
    found = []
    for c in pod.containers():
        handlers = [
            (probe, c.body.get(probe))
            for probe in ("livenessProbe", "readinessProbe", "startupProbe")
        ]
        lifecycle = _map(c.body.get("lifecycle"))
        handlers += [
            (f"lifecycle.{hook}", lifecycle.get(hook)) for hook in ("postStart", "preStop")
        ]
        for where, handler in handlers:
            for kind, host in _hosts(handler):
                found.append(
                    Violation(
                        f"{c.path}.{where}.{kind}.host",
                        f"container {c.name!r} must not probe host {host!r}",
                    )
                )
    return found


def _app_armor(pod: _Pod) -> list[Violation]:
    found = []
    contexts = [("spec.securityContext", "the pod", pod.context)]
    contexts += [
        (f"{c.path}.securityContext", f"container {c.name!r}", c.context) for c in pod.containers()
    ]
    for path, who, context in contexts:
        profile = context.get("appArmorProfile")
        if profile is not None and _map(profile).get("type") not in PROFILE_TYPES:
            found.append(
                Violation(
                    f"{path}.appArmorProfile.type",
                    f"{who} must not set AppArmor profile type {_map(profile).get('type')!r}",
                )
            )
    for key, value in _map(pod.metadata.get("annotations")).items():
        if not str(key).startswith(APPARMOR_ANNOTATION_PREFIX):
            continue
        text = str(value)
        if text and text != "runtime/default" and not text.startswith("localhost/"):
            found.append(
                Violation(
                    f"metadata.annotations[{key}]", f"AppArmor profile {text!r} is not allowed"
                )
            )
    return found


def _se_linux(pod: _Pod) -> list[Violation]:
    found = []
    contexts = [("spec.securityContext", "the pod", pod.context)]
    contexts += [
        (f"{c.path}.securityContext", f"container {c.name!r}", c.context) for c in pod.containers()
    ]
    for path, who, context in contexts:
        if context.get("seLinuxOptions") is None:
            continue
        options = _map(context.get("seLinuxOptions"))
        if str(options.get("type") or "") not in SELINUX_TYPES:
            found.append(
                Violation(
                    f"{path}.seLinuxOptions.type",
                    f"{who} must not set SELinux type {options.get('type')!r}",
                )
            )
        for key in ("user", "role"):
            if options.get(key):
                found.append(
                    Violation(
                        f"{path}.seLinuxOptions.{key}", f"{who} must not set the SELinux {key}"
                    )
                )
    return found


def _proc_mount(pod: _Pod) -> list[Violation]:
    return [
        Violation(
            c.field("procMount"),
            f"container {c.name!r} must not set procMount {c.context.get('procMount')!r}",
        )
        for c in pod.containers()
        if c.context.get("procMount") is not None and c.context.get("procMount") != "Default"
    ]


def _seccomp_type(context: Json) -> object:
    return _map(context.get("seccompProfile")).get("type")


def _seccomp_baseline(pod: _Pod) -> list[Violation]:
    found = []
    contexts = [("spec.securityContext", "the pod", pod.context)]
    contexts += [
        (f"{c.path}.securityContext", f"container {c.name!r}", c.context) for c in pod.containers()
    ]
    for path, who, context in contexts:
        if (
            context.get("seccompProfile") is not None
            and _seccomp_type(context) not in PROFILE_TYPES
        ):
            found.append(
                Violation(
                    f"{path}.seccompProfile.type",
                    f"{who} must not set seccomp profile type {_seccomp_type(context)!r}",
                )
            )
    return found


def _sysctls(pod: _Pod) -> list[Violation]:
    return [
        Violation(
            f"spec.securityContext.sysctls[{i}].name",
            f"sysctl {_map(s).get('name')!r} is not one of the safe set",
        )
        for i, s in enumerate(_list(pod.context.get("sysctls")))
        if _map(s).get("name") not in SAFE_SYSCTLS
    ]


def _restricted_volumes(pod: _Pod) -> list[Violation]:
    found = []
    for index, volume in enumerate(_list(pod.spec.get("volumes"))):
        sources = set(_map(volume)) - {"name"}
        if not sources or not sources <= RESTRICTED_VOLUME_TYPES:
            kinds = ", ".join(sorted(sources - RESTRICTED_VOLUME_TYPES)) or "no"
            found.append(
                Violation(
                    f"spec.volumes[{index}]",
                    f"volume {_map(volume).get('name')!r} uses {kinds} volume "
                    f"type (restricted allows {', '.join(sorted(RESTRICTED_VOLUME_TYPES))})",
                )
            )
    return found


def _privilege_escalation(pod: _Pod) -> list[Violation]:
    if pod.windows:
        return []
    return [
        Violation(
            c.field("allowPrivilegeEscalation"),
            f"container {c.name!r} must set allowPrivilegeEscalation=false",
        )
        for c in pod.containers()
        if c.context.get("allowPrivilegeEscalation") is not False
    ]


def _run_as_non_root(pod: _Pod) -> list[Violation]:
    found = []
    pod_value = pod.context.get("runAsNonRoot")
    if pod_value is False:
        found.append(
            Violation(
                "spec.securityContext.runAsNonRoot", "the pod must not set runAsNonRoot=false"
            )
        )
    for c in pod.containers():
        value = c.context.get("runAsNonRoot")
        if value is False or (value is None and pod_value is not True):
            found.append(
                Violation(
                    c.field("runAsNonRoot"),
                    f"the pod or container {c.name!r} must set runAsNonRoot=true",
                )
            )
    return found


def _run_as_user(pod: _Pod) -> list[Violation]:
    found = []
    if pod.context.get("runAsUser") == 0:
        found.append(Violation("spec.securityContext.runAsUser", "the pod must not run as UID 0"))
    found += [
        Violation(c.field("runAsUser"), f"container {c.name!r} must not run as UID 0")
        for c in pod.containers()
        if c.context.get("runAsUser") == 0
    ]
    return found


def _seccomp_restricted(pod: _Pod) -> list[Violation]:
    if pod.windows:
        return []
    found = _seccomp_baseline(pod)
    pod_set = _seccomp_type(pod.context) in PROFILE_TYPES
    found += [
        Violation(
            c.field("seccompProfile", "type"),
            f"the pod or container {c.name!r} must set seccompProfile.type to "
            "RuntimeDefault or Localhost",
        )
        for c in pod.containers()
        if c.context.get("seccompProfile") is None and not pod_set
    ]
    return found


def _capabilities_restricted(pod: _Pod) -> list[Violation]:
    if pod.windows:
        return []
    found = []
    for c in pod.containers():
        capabilities = _map(c.context.get("capabilities"))
        if "ALL" not in [str(cap) for cap in _list(capabilities.get("drop"))]:
            found.append(
                Violation(
                    c.field("capabilities", "drop"),
                    f'container {c.name!r} must drop ["ALL"] capabilities',
                )
            )
        extra = sorted(set(_added(c)) - {"NET_BIND_SERVICE"})
        if extra:
            found.append(
                Violation(
                    c.field("capabilities", "add"),
                    f"container {c.name!r} must not add {', '.join(extra)}",
                )
            )
    return found


BASELINE: tuple[Check, ...] = (
    _host_process,
    _host_namespaces,
    _privileged,
    _capabilities_baseline,
    _host_path_volumes,
    _host_ports,
    _probe_hosts,
    _app_armor,
    _se_linux,
    _proc_mount,
    _seccomp_baseline,
    _sysctls,
)
RESTRICTED: tuple[Check, ...] = (
    _restricted_volumes,
    _privilege_escalation,
    _run_as_non_root,
    _run_as_user,
    _seccomp_restricted,
    _capabilities_restricted,
)
OVERRIDDEN_BY_RESTRICTED: frozenset[Check] = frozenset(
    {_capabilities_baseline, _host_path_volumes, _seccomp_baseline}
)
"""Baseline checks a stricter restricted one replaces, as in Kubernetes (OverrideCheckIDs)."""


def violations(template: Json, level: PodSecurityLevel) -> list[Violation]:
    """Every way the pod template (`metadata` and `spec`) breaks the level's standard."""
    if level is PodSecurityLevel.PRIVILEGED:
        return []
    checks = BASELINE
    if level is PodSecurityLevel.RESTRICTED:
        checks = tuple(c for c in BASELINE if c not in OVERRIDDEN_BY_RESTRICTED) + RESTRICTED
    pod = _Pod(template)
    return [found for check in checks for found in check(pod)]
