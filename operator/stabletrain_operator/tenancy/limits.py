"""The administrator's limits on what a job may ask of the cluster (operator flags, chart
values `tenancy.*` and `networkPolicy.*`), with defaults that are safe on a cluster shared
by several teams.

- Node directories: `spec.checkpoints.local.hostPath` must name one of the allowed
  prefixes, and the operator mounts `<prefix>/<namespace>/<job>` below it, so two jobs
  never share a directory. It must be a prefix itself, not a directory below one: a
  directory below a prefix could pass through another job's directory, where that job can
  plant a symlink the kubelet would follow on the node.
- Local volume types: which core/v1 volume sources `spec.checkpoints.local.volume` may use.
  hostPath is never one of them (it goes through the prefixes above).
- Pod Security level: the Kubernetes Pod Security Standard the worker template must meet,
  checked by the operator before it creates any pod, whatever the namespace enforces.
- Network: every job's own NetworkPolicy (network_policy.py).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from enum import StrEnum

from stabletrain_operator.api.spec import bad_directory
from stabletrain_operator.tenancy.network_policy import NetworkSettings


class PodSecurityLevel(StrEnum):
    """The Kubernetes Pod Security Standards' levels (kubernetes.io/docs/concepts/security/
    pod-security-standards), checked as Kubernetes v1.34 checks them."""

    PRIVILEGED = "privileged"
    """Anything goes: for clusters where every job's author could run privileged pods anyway."""
    BASELINE = "baseline"
    """No host namespaces, privileged containers, added capabilities beyond the default set,
    hostPath volumes in the template, host ports, unsafe sysctls, AppArmor, SELinux or
    seccomp opt-outs."""
    RESTRICTED = "restricted"
    """Baseline plus: non-root, no privilege escalation, every capability dropped, seccomp
    RuntimeDefault or Localhost, only ephemeral and claim-like volume types."""


DEFAULT_HOST_PATH_PREFIXES = ("/var/lib/stabletrain",)
DEFAULT_LOCAL_VOLUME_TYPES = frozenset({"emptyDir", "ephemeral", "persistentVolumeClaim"})
"""Volume sources a job owns or its namespace already holds: nothing of the node, nothing
of another namespace."""
VOLUME_SOURCES = frozenset(
    {
        "awsElasticBlockStore",
        "azureDisk",
        "azureFile",
        "cephfs",
        "cinder",
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "fc",
        "flexVolume",
        "flocker",
        "gcePersistentDisk",
        "gitRepo",
        "glusterfs",
        "hostPath",
        "image",
        "iscsi",
        "nfs",
        "persistentVolumeClaim",
        "photonPersistentDisk",
        "portworxVolume",
        "projected",
        "quobyte",
        "rbd",
        "scaleIO",
        "secret",
        "storageos",
        "vsphereVolume",
    }
)
"""The volume sources of core/v1 VolumeSource (Kubernetes v1.34)."""


@dataclass(frozen=True)
class TenancySettings:
    host_path_prefixes: tuple[str, ...] = DEFAULT_HOST_PATH_PREFIXES
    """Node directories `local.hostPath` may name; empty: no hostPath at all."""
    local_volume_types: frozenset[str] = field(default=DEFAULT_LOCAL_VOLUME_TYPES)
    """Volume sources `local.volume` may use; empty: none (hostPath only)."""
    pod_security: PodSecurityLevel = PodSecurityLevel.BASELINE
    network: NetworkSettings = field(default_factory=NetworkSettings)
    """Every job's own NetworkPolicy (network_policy.py)."""


def parse_host_path_prefixes(text: str) -> tuple[str, ...]:
    """`--host-path-prefixes`: comma-separated absolute directories; empty: none."""
    prefixes = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        problem = bad_directory(item)
        if problem is not None:
            raise ValueError(f"--host-path-prefixes: {item!r} cannot be a prefix: {problem}")
        prefixes.append(posixpath.normpath(item))
    return tuple(prefixes)


def parse_volume_types(text: str) -> frozenset[str]:
    """`--local-volume-types`: comma-separated core/v1 volume source names; empty: none."""
    types = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(types - VOLUME_SOURCES)
    if unknown:
        raise ValueError(
            f"--local-volume-types: {', '.join(unknown)} is not a core/v1 volume source "
            f"(one of {', '.join(sorted(VOLUME_SOURCES))})"
        )
    if "hostPath" in types:
        raise ValueError(
            "--local-volume-types: hostPath is not allowed here; node directories are "
            "allowed by --host-path-prefixes"
        )
    return frozenset(types)
