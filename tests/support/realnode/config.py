"""The configuration files of the node's components: containerd, CNI, kubelet, kube-proxy.

Every path is the node's own (its workdir), never the system's, and every address is inside
the node's network namespace: the node's address on a dummy link, the pods' /24 on the CNI
bridge. Neither is routed anywhere else, because the namespace has no link out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

NODE_ADDRESS = "10.250.0.1"
"""The node's InternalIP, the API server's advertised address, and the cluster DNS."""
POD_SUBNET = "10.251.0.0/24"
POD_GATEWAY = "10.251.0.1"
CLUSTER_DOMAIN = "cluster.local"
BRIDGE = "cni0"


@dataclass(frozen=True)
class NodePaths:
    """Where each component keeps its files, all under the node's workdir."""

    workdir: Path

    @property
    def containerd_config(self) -> Path:
        return self.workdir / "containerd.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.workdir / "cni" / "net.d"

    @property
    def kubelet_root(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.workdir / "kubelet.yaml"

    @property
    def proxy_config(self) -> Path:
        return self.workdir / "kube-proxy.yaml"

    @property
    def resolv_conf(self) -> Path:
        return self.workdir / "resolv.conf"


def write_containerd_config(paths: NodePaths, sandbox_image: str) -> None:
    root = paths.workdir / "containerd"
    paths.containerd_config.write_text(
        f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
[grpc]
  address = "{paths.containerd_socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  # The VM lacks CAP_SYS_RESOURCE: never lower a process's oom_score_adj below our own.
  restrict_oom_score_adj = true
  # Pod network namespaces pinned under our state dir, not /var/run/netns.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{paths.cni_conf_dir}"
"""
    )


def write_cni_config(paths: NodePaths) -> None:
    paths.cni_conf_dir.mkdir(parents=True, exist_ok=True)
    conflist = {
        "cniVersion": "1.0.0",
        "name": "stabletrain",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "hairpinMode": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.workdir / "cni" / "ipam"),
                },
            }
        ],
    }
    (paths.cni_conf_dir / "10-stabletrain.conflist").write_text(json.dumps(conflist, indent=2))


def write_kubelet_config(paths: NodePaths, ca: Path, cgroup_root: str) -> None:
    paths.resolv_conf.write_text(f"search {CLUSTER_DOMAIN}\n")
    paths.kubelet_config.write_text(
        f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 only here (mounted per controller); 1.34 refuses it unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
failSwapOn: false
containerRuntimeEndpoint: unix://{paths.containerd_socket}
address: {NODE_ADDRESS}
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {ca}
authorization:
  mode: AlwaysAllow
clusterDNS: [{NODE_ADDRESS}]
clusterDomain: {CLUSTER_DOMAIN}
resolvConf: {paths.resolv_conf}
podLogsDir: {paths.workdir / "pod-logs"}
# Heartbeats well inside the test control plane's 10 s node-monitor grace period.
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 10s
nodeLeaseDurationSeconds: 8
# The images exist only locally: never collect them, never evict for a busy disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%"
  imagefs.available: "1%"
serializeImagePulls: false
"""
    )


def write_proxy_config(paths: NodePaths, kubeconfig: Path, node_name: str) -> None:
    paths.proxy_config.write_text(
        f"""apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: {node_name}
clusterCIDR: {POD_SUBNET}
clientConnection:
  kubeconfig: {kubeconfig}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# 0: leave the conntrack table size and timeouts alone (the size is kernel-wide).
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"""
    )
