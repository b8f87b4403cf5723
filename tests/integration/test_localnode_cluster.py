"""Pods talking across nodes by cluster DNS names, torchrun over gloo, node loss, and storage
that outlives a pod: the local node behaves like a small cluster."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

from kubernetes import client

from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.localnode.api import Json
from support.localnode.leftovers import find_leftovers
from support.localnode.registry import CREATED, Created
from support.localnode.sweep import marked_processes
from support.localnode.testing import (
    create,
    headless_service,
    pod_manifest,
    read_pod,
    wait_for,
    wait_terminated,
)

ON_NODE = "kubernetes.io/hostname"
POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}

SERVER = """
import socket, sys
with socket.create_server(("0.0.0.0", 7000)) as server:
    print("listening", flush=True)
    while True:
        connection, peer = server.accept()
        with connection:
            connection.sendall(f"hello {peer[0]} from {socket.gethostname()}".encode())
"""

CLIENT = """
import pathlib, socket, sys, time
replies = []
for name in sys.argv[1:]:
    deadline = time.time() + 30
    while True:
        try:
            with socket.create_connection((name, 7000), timeout=2) as connection:
                replies.append(name + " -> " + connection.recv(200).decode())
                break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
pathlib.Path("/dev/termination-log").write_text("\\n".join(replies))
"""


def test_a_pod_on_node_a_reaches_a_pod_on_node_b_by_its_dns_name(
    local_cluster: LocalCluster, pod_namespace: str
) -> None:
    api = local_cluster.api
    create(api, pod_namespace, "services", headless_service("workers", {"app": "echo"}))
    server = pod_manifest(
        "server-pod", ["python", "-c", SERVER], labels={"app": "echo"}, hostname="echo-0",
        subdomain="workers", nodeSelector={ON_NODE: "node-b"},
    )  # fmt: skip
    create(api, pod_namespace, "pods", server)
    full = f"echo-0.workers.{pod_namespace}.svc.cluster.local"
    client = pod_manifest(
        "client",
        ["python", "-c", CLIENT, full, "echo-0.workers", f"echo-0.workers.{pod_namespace}"],
        nodeSelector={ON_NODE: "node-a"},
    )  # fmt: skip
    create(api, pod_namespace, "pods", client)

    state = wait_terminated(api, pod_namespace, "client", timeout=60)
    assert state["exitCode"] == 0, local_cluster.logs(pod_namespace, "client")
    server_pod, client_pod = (read_pod(api, pod_namespace, n) for n in ("server-pod", "client"))
    assert server_pod is not None
    assert client_pod is not None
    assert server_pod["spec"]["nodeName"] == "node-b"
    assert client_pod["spec"]["nodeName"] == "node-a"
    server_ip, client_ip = server_pod["status"]["podIP"], client_pod["status"]["podIP"]
    assert server_ip != client_ip
    replies = state["message"].splitlines()
    print("\n".join(replies))
    assert replies == [
        f"{name} -> hello {client_ip} from echo-0"
        for name in (full, "echo-0.workers", f"echo-0.workers.{pod_namespace}")
    ]
    # The host reaches pod IPs too (the operator scrapes pods' metrics from there).
    with socket.create_connection((server_ip, 7000), timeout=5) as connection:
        assert connection.recv(200).decode().endswith("from echo-0")


TRAIN = """
import os, pathlib, torch, torch.distributed as dist
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
pathlib.Path("/dev/termination-log").write_text(
    f"rank={dist.get_rank()} world={dist.get_world_size()} sum={value.item()}"
)
dist.destroy_process_group()
"""


def test_torchrun_across_two_pods_completes_an_all_reduce(
    local_cluster: LocalCluster, pod_namespace: str
) -> None:
    api = local_cluster.api
    create(
        api,
        pod_namespace,
        "configmaps",
        {"metadata": {"name": "train"}, "data": {"train.py": TRAIN}},
    )
    create(api, pod_namespace, "services", headless_service("trainer", {"job": "allreduce"}))
    endpoint = f"trainer-0.trainer.{pod_namespace}.svc.cluster.local:29400"
    for rank, node in enumerate(("node-a", "node-b")):
        command = [
            "torchrun", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", "--rdzv-id=allreduce", "--local-addr=$(POD_IP)",
            "--max-restarts=0", "/job/train.py",
        ]  # fmt: skip
        manifest = pod_manifest(
            f"trainer-{rank}", command, labels={"job": "allreduce"}, hostname=f"trainer-{rank}",
            subdomain="trainer", nodeSelector={ON_NODE: node},
            volumes=[{"name": "job", "configMap": {"name": "train"}}],
            container={"env": [POD_IP_ENV, {"name": "OMP_NUM_THREADS", "value": "1"}],
                       "volumeMounts": [{"name": "job", "mountPath": "/job"}]},
        )  # fmt: skip
        create(api, pod_namespace, "pods", manifest)

    began = time.monotonic()
    results = [wait_terminated(api, pod_namespace, f"trainer-{r}", timeout=120) for r in (0, 1)]
    for rank, state in enumerate(results):
        assert state["exitCode"] == 0, local_cluster.logs(pod_namespace, f"trainer-{rank}")
    messages = sorted(state["message"] for state in results)
    print(f"torchrun finished in {time.monotonic() - began:.1f} s: {messages}")
    assert messages == ["rank=0 world=2 sum=3.0", "rank=1 world=2 sum=3.0"]


def _node_condition(api_pod: Json | None, kind: str) -> str:
    for condition in ((api_pod or {}).get("status") or {}).get("conditions") or []:
        if condition["type"] == kind:
            return str(condition["status"])
    return ""


def test_a_lost_nodes_pods_are_deleted_by_the_control_plane(
    local_cluster: LocalCluster, pod_namespace: str, control_plane: ControlPlane
) -> None:
    api = local_cluster.api
    for name, target in (("doomed-0", "node-b"), ("doomed-1", "node-b"), ("survivor", "node-a")):
        manifest = pod_manifest(name, ["sleep", "3600"], nodeSelector={ON_NODE: target})
        create(api, pod_namespace, "pods", manifest)

    def all_running() -> bool:
        pods = [read_pod(api, pod_namespace, n) for n in ("doomed-0", "doomed-1", "survivor")]
        return all((p or {}).get("status", {}).get("phase") == "Running" for p in pods)

    wait_for(all_running, 30, "three running pods")
    doomed_uids = {
        name: (read_pod(api, pod_namespace, name) or {})["metadata"]["uid"]
        for name in ("doomed-0", "doomed-1")
    }
    began = time.monotonic()
    local_cluster.lose_node("node-b")
    for name, uid in doomed_uids.items():
        left = marked_processes(f"{local_cluster.marker}/{uid}/")
        assert left == [], f"{name}: processes survived the node: {left}"

    # kube-controller-manager notices the silence, marks the node and taints it ...
    node_path = "/api/v1/nodes/node-b"
    wait_for(lambda: _node_condition(api.get(node_path), "Ready") == "Unknown", 40, "NotReady")
    not_ready_after = time.monotonic() - began

    def unreachable_taint() -> bool:
        taints = (api.get(node_path) or {}).get("spec", {}).get("taints") or []
        return any(t["key"] == "node.kubernetes.io/unreachable" for t in taints)

    # The taint follows the condition on the controller's next pass, not in the same write.
    wait_for(unreachable_taint, 10, "the unreachable taint")
    node = api.get(node_path)
    assert node is not None
    # ... its taint-eviction controller marks the pods for deletion (nobody confirms it) ...
    wait_for(
        lambda: all((read_pod(api, pod_namespace, n) or {}).get("metadata", {}).get(
            "deletionTimestamp") for n in doomed_uids),
        30, "taint eviction to mark the pods for deletion",
    )  # fmt: skip
    marked_after = time.monotonic() - began
    time.sleep(2)
    assert all(read_pod(api, pod_namespace, n) is not None for n in doomed_uids), (
        "nothing but PodGC may finalize them: their node is silent"
    )
    # ... and after an administrator declares the node out of service (the documented step
    # for a node that will not come back), PodGC force-deletes them.
    out_of_service = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
                      "effect": "NoExecute"}  # fmt: skip
    taints_now = [*(node["spec"].get("taints") or []), out_of_service]
    api.merge_patch(node_path, {"spec": {"taints": taints_now}})
    wait_for(
        lambda: all(read_pod(api, pod_namespace, n) is None for n in doomed_uids),
        45, "PodGC to delete the lost node's pods",
    )  # fmt: skip
    deleted_after = time.monotonic() - began
    survivor = read_pod(api, pod_namespace, "survivor")
    assert survivor is not None
    assert survivor["status"]["phase"] == "Running"
    # The deletions are kube-controller-manager's own, in its own words.
    log = (control_plane.workdir / "kube-controller-manager.log").read_text(errors="replace")
    for name in doomed_uids:
        pod_key = f'pod="{pod_namespace}/{name}"'
        assert any('"Deleting pod"' in line and "taint-eviction-controller" in line
                   and pod_key in line for line in log.splitlines()), pod_key  # fmt: skip
        assert any('"PodGC is force deleting Pod"' in line and pod_key in line
                   for line in log.splitlines()), pod_key  # fmt: skip
    survivor_key = f'pod="{pod_namespace}/survivor"'
    deletions = ('"Deleting pod"', '"PodGC is force deleting Pod"')
    assert not [line for line in log.splitlines()
                if survivor_key in line and any(d in line for d in deletions)]  # fmt: skip
    wait_for(
        lambda: all((n, "TaintManagerEviction") in {
            (e["involvedObject"]["name"], e["reason"])
            for e in api.items(f"/api/v1/namespaces/{pod_namespace}/events")} for n in doomed_uids),
        10, "TaintManagerEviction events for both pods",
    )  # fmt: skip
    print(
        f"lost node: NotReady after {not_ready_after:.1f} s, pods marked for deletion after "
        f"{marked_after:.1f} s, deleted by PodGC after {deleted_after:.1f} s"
    )


def test_a_relaunched_pod_reads_what_its_predecessor_wrote_on_the_same_node(
    local_cluster: LocalCluster, pod_namespace: str
) -> None:
    api = local_cluster.api
    claim = {"metadata": {"name": "pfs"}, "spec": {"accessModes": ["ReadWriteMany"],
             "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    create(api, pod_namespace, "persistentvolumeclaims", claim)
    volumes = [
        {"name": "nvme", "hostPath": {"path": "/mnt/nvme", "type": "DirectoryOrCreate"}},
        {"name": "pfs", "persistentVolumeClaim": {"claimName": "pfs"}},
    ]
    mounts = [{"name": "nvme", "mountPath": "/nvme"}, {"name": "pfs", "mountPath": "/pfs"}]
    write = "echo -n step-100 > /nvme/latest && echo -n step-100 > /pfs/latest"
    writer = pod_manifest(
        "trainer", ["sh", "-c", write], volumes=volumes, container={"volumeMounts": mounts}
    )
    create(api, pod_namespace, "pods", writer)
    assert wait_terminated(api, pod_namespace, "trainer")["exitCode"] == 0
    first = read_pod(api, pod_namespace, "trainer")
    assert first is not None
    previous_node = first["spec"]["nodeName"]
    other_node = "node-b" if previous_node == "node-a" else "node-a"
    # Load the previous node, so the default spreading would send the successor elsewhere.
    for index in range(2):
        create(api, pod_namespace, "pods", pod_manifest(
            f"busy-{index}", ["sleep", "3600"], nodeSelector={ON_NODE: previous_node}))  # fmt: skip
    api.delete(f"/api/v1/namespaces/{pod_namespace}/pods/trainer")
    wait_for(lambda: read_pod(api, pod_namespace, "trainer") is None, 30, "the old pod to go")

    read = (
        'echo -n "$(cat /nvme/latest 2>/dev/null || echo none) $(cat /pfs/latest)" '
        "> /dev/termination-log"
    )
    prefer_previous = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [previous_node]}]}}]}}  # fmt: skip
    successor = pod_manifest("trainer", ["sh", "-c", read], volumes=volumes,
                             container={"volumeMounts": mounts},
                             affinity=prefer_previous)  # fmt: skip
    create(api, pod_namespace, "pods", successor)
    stranger = pod_manifest("stranger", ["sh", "-c", read], volumes=volumes,
                            container={"volumeMounts": mounts},
                            nodeSelector={ON_NODE: other_node})  # fmt: skip
    create(api, pod_namespace, "pods", stranger)

    assert wait_terminated(api, pod_namespace, "trainer")["message"] == "step-100 step-100"
    second = read_pod(api, pod_namespace, "trainer")
    assert second is not None
    assert second["spec"]["nodeName"] == previous_node
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    # Another node has its own "NVMe" but shares the "PFS".
    assert wait_terminated(api, pod_namespace, "stranger")["message"] == "none step-100"
    assert (
        local_cluster.host_path(previous_node, "/mnt/nvme") / "latest"
    ).read_text() == "step-100"
    assert not (local_cluster.host_path(other_node, "/mnt/nvme") / "latest").exists()


def _links_and_mounts() -> tuple[set[str], set[str]]:
    listed = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True)
    links = {link["ifname"] for link in json.loads(listed.stdout)}
    mounts = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    return links, mounts


def test_stopping_a_cluster_leaves_nothing_behind(
    api_client: client.ApiClient, pod_namespace: str
) -> None:
    """A cluster of its own, stopped while its pod runs: no process, namespace, link, mount or
    directory of it survives (and the check does see them while they exist)."""
    links_before, mounts_before = _links_and_mounts()
    namespaces_before = len(CREATED.namespaces)
    with LocalCluster(api_client, nodes=("node-x",)) as cluster:
        manifest = pod_manifest("lingers", ["sleep", "3600"], nodeName="node-x")
        create(cluster.api, pod_namespace, "pods", manifest)
        wait_for(lambda: (read_pod(cluster.api, pod_namespace, "lingers") or {}).get(
            "status", {}).get("phase") == "Running", 30, "the pod to run")  # fmt: skip
        assert cluster.network is not None
        created = Created(
            markers=[cluster.marker],
            namespaces=CREATED.namespaces[namespaces_before:],
            links=[cluster.network.uplink],
            directories=[cluster.root],
        )
        while_running = find_leftovers(created)
        assert any(item.startswith("process") for item in while_running)
        assert any("namespace" in item for item in while_running)
        assert f"host link {cluster.network.uplink}" in while_running
    assert find_leftovers(created) == []
    assert _links_and_mounts() == (links_before, mounts_before)
    assert cluster.api.get("/api/v1/nodes/node-x") is None
    assert read_pod(cluster.api, pod_namespace, "lingers") is None
