"""A Node object kept alive the way a kubelet keeps it: a Lease renewed every few seconds.

kube-controller-manager's node lifecycle controller reads the Lease in kube-node-lease (and the
Ready condition's heartbeat) and marks the node NotReady, taints it and evicts its pods once
neither moves for --node-monitor-grace-period. Losing a node is therefore just: stop renewing.
"""

from __future__ import annotations

import datetime
import logging
import platform
import threading
import uuid

from support.localnode.api import Json, RawApi

LEASE_DURATION_SECONDS = 40
RENEW_INTERVAL_SECONDS = 2.0
STATUS_INTERVAL_SECONDS = 10.0
NODE_LABEL = "stabletrain.dev/local-node"
"""Set on every node this harness registers, so they can be told apart from any other."""

log = logging.getLogger(__name__)


def now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(since: str, heartbeat: str) -> list[Json]:
    healthy = [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
    ]
    conditions = [
        {"type": kind, "status": "False", "reason": reason, "message": "local node",
         "lastHeartbeatTime": heartbeat, "lastTransitionTime": since}
        for kind, reason in healthy
    ]  # fmt: skip
    conditions.append(
        {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "message": "local node is posting ready status",
         "lastHeartbeatTime": heartbeat, "lastTransitionTime": since}
    )  # fmt: skip
    return conditions


def node_info() -> Json:
    """Made once per node: a changing boot ID would tell the control plane it rebooted."""
    return {
        "machineID": uuid.uuid4().hex, "systemUUID": str(uuid.uuid4()),
        "bootID": str(uuid.uuid4()), "kernelVersion": platform.release(),
        "osImage": "stabletrain local node", "containerRuntimeVersion": "localnode://0",
        "kubeletVersion": "v1.34.4", "kubeProxyVersion": "", "operatingSystem": "linux",
        "architecture": "amd64",
    }  # fmt: skip


def node_status(address: str, info: Json, since: str, heartbeat: str) -> Json:
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": _conditions(since, heartbeat),
        "addresses": [{"type": "InternalIP", "address": address}],
        "nodeInfo": info,
    }


class NodeAgent:
    """Registers one Node (with its Lease) and heartbeats it from a thread until stopped."""

    def __init__(self, api: RawApi, name: str, address: str, labels: dict[str, str]) -> None:
        self.api = api
        self.name = name
        self.address = address
        self.labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", NODE_LABEL: "true", **labels}  # fmt: skip
        self._info = node_info()
        self._since = now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name=f"node-{name}", daemon=True)

    def register(self) -> None:
        if self.api.get(f"/api/v1/nodes/{self.name}") is not None:
            raise RuntimeError(
                f"node {self.name} already exists in the cluster; another local cluster (or a "
                "crashed one) owns that name"
            )
        self.api.post(
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node",
             "metadata": {"name": self.name, "labels": self.labels}, "spec": {}},
        )  # fmt: skip
        self._post_status()
        self._renew_lease()
        self._thread.start()

    def _post_status(self) -> None:
        self.api.request(
            "PATCH",
            f"/api/v1/nodes/{self.name}/status",
            {"status": node_status(self.address, self._info, self._since, now())},
            content_type="application/strategic-merge-patch+json",
        )

    def _renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_DURATION_SECONDS,
                "renewTime": now_micro()}  # fmt: skip
        if self.api.get(path) is None:
            self.api.post(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": self.name}, "spec": spec},
            )  # fmt: skip
        else:
            self.api.merge_patch(path, {"spec": spec})

    def _heartbeat(self) -> None:
        since_status = 0.0
        while not self._stop.wait(RENEW_INTERVAL_SECONDS):
            try:
                self._renew_lease()
                since_status += RENEW_INTERVAL_SECONDS
                if since_status >= STATUS_INTERVAL_SECONDS:
                    self._post_status()
                    since_status = 0.0
            except Exception as error:  # a heartbeat outlives any one failed request
                log.warning("node %s heartbeat failed: %s", self.name, error)

    def stop_heartbeats(self) -> None:
        """What a lost node looks like from the control plane: silence."""
        self._stop.set()
        self._thread.join(timeout=10)

    def resume_heartbeats(self) -> None:
        """The node is back (same boot: a partition healed, a hung kubelet recovered): Ready
        and a fresh Lease at once, then the usual heartbeat."""
        if self._thread.is_alive():
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"node-{self.name}", daemon=True
        )
        self._post_status()
        self._renew_lease()
        self._thread.start()

    def deregister(self) -> None:
        self.stop_heartbeats()
        self.api.delete(f"/api/v1/nodes/{self.name}")
        self.api.delete(
            f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        )
