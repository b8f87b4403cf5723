"""Cluster DNS as an /etc/hosts file: every pod's per-pod name under a headless Service.

CoreDNS answers `<hostname>.<service>.<namespace>.svc.cluster.local` from the EndpointSlices
that kube-controller-manager keeps for a headless Service (an endpoint carries the pod's
`hostname` when the pod's `subdomain` names the Service). The same slices feed these files, so
names appear and disappear when the control plane says so. The search path of a pod in
namespace N (`N.svc.cluster.local svc.cluster.local cluster.local`) is spelled out as the
shorter names it would complete, because /etc/hosts has no search path.

Files are rewritten in place (a bind mount pins the inode, so rename would not reach a running
container), only when their text changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from support.localnode.api import Json

CLUSTER_DOMAIN = "cluster.local"
HEADLESS_LABEL = "service.kubernetes.io/headless"
SERVICE_LABEL = "kubernetes.io/service-name"
HEADER = """# Kubernetes-managed hosts file (stabletrain local node, names from EndpointSlices).
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
"""


@dataclass(frozen=True, order=True)
class Endpoint:
    """One ready address of a headless Service, with the pod's hostname if it has one."""

    namespace: str
    service: str
    address: str
    hostname: str


def headless_endpoints(slices: Iterable[Json]) -> list[Endpoint]:
    found = set()
    for endpoint_slice in slices:
        labels = endpoint_slice["metadata"].get("labels") or {}
        if HEADLESS_LABEL not in labels or SERVICE_LABEL not in labels:
            continue
        namespace = endpoint_slice["metadata"]["namespace"]
        for endpoint in endpoint_slice.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            for address in endpoint.get("addresses") or []:
                hostname = endpoint.get("hostname", "")
                found.add(Endpoint(namespace, labels[SERVICE_LABEL], address, hostname))
    return sorted(found)


def _names(fqdn_stem: str, namespace: str, own_namespace: str) -> list[str]:
    """`a.b` in namespace n: full name, then what the pod's search path completes to it."""
    full = f"{fqdn_stem}.{namespace}.svc.{CLUSTER_DOMAIN}"
    names = [full, f"{fqdn_stem}.{namespace}.svc", f"{fqdn_stem}.{namespace}"]
    if namespace == own_namespace:
        names.append(fqdn_stem)
    return names


def hosts_text(pod: Json, pod_ip: str, endpoints: Iterable[Endpoint]) -> str:
    spec = pod["spec"]
    namespace = pod["metadata"]["namespace"]
    hostname = pod_hostname(pod)
    lines = [HEADER.rstrip("\n")]
    subdomain = spec.get("subdomain")
    if subdomain:
        own = f"{hostname}.{subdomain}.{namespace}.svc.{CLUSTER_DOMAIN}"
        lines.append(f"{pod_ip}\t{own}\t{hostname}")
    else:
        lines.append(f"{pod_ip}\t{hostname}")
    for endpoint in endpoints:
        if endpoint.hostname:
            stem = f"{endpoint.hostname}.{endpoint.service}"
            names = _names(stem, endpoint.namespace, namespace)
            lines.append(f"{endpoint.address}\t{' '.join(names)}")
        service_names = _names(endpoint.service, endpoint.namespace, namespace)
        lines.append(f"{endpoint.address}\t{' '.join(service_names)}")
    return "\n".join(lines) + "\n"


def pod_hostname(pod: Json) -> str:
    """spec.hostname, else the pod's name cut to a DNS label, as the kubelet does."""
    hostname: str = pod["spec"].get("hostname") or pod["metadata"]["name"]
    return hostname[:63].rstrip("-.")


def write_in_place(path: Path, text: str) -> bool:
    """Rewrites the file keeping its inode (bind mounts pin it); False when unchanged."""
    data = text.encode()
    if path.exists() and path.read_bytes() == data:
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    return True
