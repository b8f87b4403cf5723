"""A pod sandbox: network, UTS and PID namespaces held by a pause process, with the pod's IP.

As with a kubelet's sandbox, the namespaces outlive each container (a restarted container gets
the same IP and hostname) and die with the pod. The pause process is PID 1 of the pod's PID
namespace (as with shareProcessNamespace), so stopping it kills every process of the pod, even
ones that left the container's process group, and so does a killed test run. Containers join
with nsenter and then each get a mount namespace of their own (see container_init.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path

from support.localnode.api import Json
from support.localnode.hosts import (
    CLUSTER_DOMAIN,
    Endpoint,
    hosts_text,
    pod_hostname,
    write_in_place,
)
from support.localnode.namespaces import NamespaceHolder
from support.localnode.network import ClusterNetwork


def resolv_conf(namespace: str) -> str:
    """The kubelet's search path, but no reachable name server: names come from /etc/hosts.

    The host's name server is unreachable from the pod network, and a query to it would hang
    for its timeout on every lookup /etc/hosts cannot answer (gloo and c10d do reverse lookups
    of peer addresses); a closed port on the pod's own loopback fails such lookups at once.
    """
    return (
        "nameserver 127.0.0.1\n"
        f"search {namespace}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\n"
        "options ndots:5 timeout:1 attempts:1\n"
    )


class PodSandbox:
    def __init__(
        self, pod: Json, pod_dir: Path, network: ClusterNetwork, port: str, marker: str
    ) -> None:
        self.hostname = pod_hostname(pod)
        self.hosts_file = pod_dir / "etc-hosts"
        self.hostname_file = pod_dir / "etc-hostname"
        self.resolv_conf = pod_dir / "etc-resolv.conf"
        self._network = network
        self.address: ipaddress.IPv4Address | None = None
        self.holder = NamespaceHolder(
            f"sandbox-{pod['metadata']['name']}",
            ["net", "uts", "pid"],
            pod_dir / "sandbox.log",
            marker,
        )
        try:
            self.holder.run("hostname", self.hostname, kinds=("uts",))
            self.address = network.allocate()
            network.attach(self.holder, self.address, port)
            self.hostname_file.write_text(self.hostname + "\n")
            self.resolv_conf.write_text(resolv_conf(pod["metadata"]["namespace"]))
            self.update_hosts(pod, [])
        except BaseException:
            self.stop()
            raise

    @property
    def ip(self) -> str:
        return str(self.address)

    def update_hosts(self, pod: Json, endpoints: Sequence[Endpoint]) -> None:
        write_in_place(self.hosts_file, hosts_text(pod, self.ip, endpoints))

    def enter(self) -> list[str]:
        """argv prefix joining this pod's network, UTS and PID namespaces (nsenter forks for
        the PID namespace and waits, relaying the exit status)."""
        return self.holder.enter("net", "uts", "pid")

    def stop(self) -> None:
        self.holder.stop()
        if self.address is not None:
            self._network.release(self.address)
            self.address = None
