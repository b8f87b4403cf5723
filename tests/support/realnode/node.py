"""A real Kubernetes node for the tests: containerd, runc, CNI, kubelet, kube-proxy,
kube-scheduler and a cluster DNS, beside a control plane of its own, all inside one network
namespace and one private mount namespace that the test creates.

    with running_real_cluster() as cluster:   # the node is Ready here
        cluster.kubectl("get", "pods", "-A")

The test process stays in the host's namespaces and reaches the API server through a
forwarded loopback port (netns.py). Host state the node changes is recorded first and
restored on any exit, and by the next run after a SIGKILL (hoststate.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from support.controlplane import ControlPlane, start_control_plane, write_kubeconfig
from support.processes import ManagedProcess, free_port
from support.realnode import config, hoststate
from support.realnode.images import Image, build_images, import_images
from support.realnode.netns import Forwarder, call_in_netns

TESTS_DIR = Path(__file__).resolve().parents[2]
NODE_BINARIES = ("kubelet", "kube-proxy", "kube-scheduler")
T = TypeVar("T")


class NodeNetwork:
    """The control plane's PlaneNetwork: the node's namespace, reached by forwarders."""

    def __init__(self, launcher: tuple[str, ...], netns: Path) -> None:
        self.address = config.NODE_ADDRESS
        self.launcher = launcher
        self.netns = netns
        self.forwarders: list[Forwarder] = []

    def reach(self, host: str, port: int) -> int:
        try:
            forwarder = Forwarder(self.netns, host, port, listen_port=port)
        except OSError:  # that port is taken on the host: any other will do
            forwarder = Forwarder(self.netns, host, port)
        self.forwarders.append(forwarder)
        return forwarder.port

    def close(self) -> None:
        for forwarder in self.forwarders:
            forwarder.close()
        self.forwarders.clear()


@dataclass
class RealCluster:
    """A control plane and one real node, Ready."""

    plane: ControlPlane
    node_name: str
    state: hoststate.HostState
    paths: config.NodePaths
    images: dict[str, Image]
    netns: Path
    timings: dict[str, float] = field(default_factory=dict)

    def kubectl(self, *args: str) -> list[str]:
        return self.plane.kubectl(*args)

    def in_node(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Runs a command inside the node's namespaces (curl a pod IP, list nft rules)."""
        return subprocess.run(
            [*_nsenter(self.netns), *argv], capture_output=True, text=True, timeout=timeout,
            check=False,
        )  # fmt: skip

    def call_in_node(self, action: Callable[[], T]) -> T:
        """Runs `action` on a thread inside the node's network (pod IPs are routed there)."""
        return call_in_netns(self.netns, action)


def _nsenter(netns: Path) -> list[str]:
    holder = netns.parent.parent
    return ["nsenter", f"--net={holder}/ns/net", f"--mount={holder}/ns/mnt", "--"]


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed: {done.stderr.strip()}")


def _enter_script(state: hoststate.HostState, cgroups: list[Path], workdir: Path) -> Path:
    """Runs its arguments as part of the node: in its cgroups, then (once the holder exists)
    in its namespaces. Everything the node runs starts through it, so every process the node
    ever has, shims and containers included, is in the node's cgroup tree."""
    joins = "\n".join(f'echo $$ >"{c}/cgroup.procs"' for c in cgroups)
    script = workdir / "enter.sh"
    script.write_text(
        f"""#!/bin/sh
# The real node {state.node_id}: join its cgroups, then its namespaces, then exec.
{joins}
if [ "$1" = --holder ]; then
    shift
    exec unshare --net --mount --propagation private -- "$@"
fi
holder=$(cat "{workdir}/holder.pid")
exec nsenter --net=/proc/$holder/ns/net --mount=/proc/$holder/ns/mnt -- "$@"
"""
    )
    script.chmod(0o755)
    return script


def _wait_for(what: str, check: object, proc: ManagedProcess | None, timeout: float) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited while waiting for {what}:\n{proc.log_tail()}")
        if check():
            return
        time.sleep(0.2)
    tail = f":\n{proc.log_tail()}" if proc is not None else ""
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}{tail}")


class _NodeStarter:
    def __init__(self, state: hoststate.HostState, workdir: Path, bin_dir: Path) -> None:
        self.state = state
        self.workdir = workdir
        self.bin_dir = bin_dir
        self.paths = config.NodePaths(workdir)
        self.processes: list[ManagedProcess] = []
        self.node_name = f"realnode-{state.node_id}"
        self.network: NodeNetwork | None = None
        self.plane: ControlPlane | None = None

    def start_holder(self) -> Path:
        cgroups = hoststate.create_cgroups(self.state)
        self.enter = _enter_script(self.state, cgroups, self.workdir)
        holder = ManagedProcess(
            "namespace-holder",
            ["sh", str(self.enter), "--holder", "sleep", "infinity"],
            self.workdir / "holder.log",
        )
        self.processes.append(holder)
        (self.workdir / "holder.pid").write_text(str(holder.pid))
        netns = Path(f"/proc/{holder.pid}/ns/net")
        ours = os.stat("/proc/self/ns/net").st_ino
        _wait_for("the node's namespaces", lambda: os.stat(netns).st_ino != ours, holder, 10)
        enter = _nsenter(netns)
        _run([*enter, "ip", "link", "set", "lo", "up"])
        # The node's address needs a link with carrier (kubelet reads it from the links), and
        # this kernel has no dummy links: a veth pair whose both ends stay in the namespace.
        _run([*enter, "ip", "link", "add", "node0", "type", "veth", "peer", "name", "node0-peer"])
        _run([*enter, "ip", "addr", "add", f"{config.NODE_ADDRESS}/32", "dev", "node0"])
        _run([*enter, "ip", "link", "set", "node0-peer", "up"])
        _run([*enter, "ip", "link", "set", "node0", "up"])
        for directory in hoststate.SHADOWED_DIRS:
            if not Path(directory).exists():
                self.state.created_dirs.append(directory)
                self.state.save()
                Path(directory).mkdir(parents=True)
            _run([*enter, "mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", directory])
        return netns

    def spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> ManagedProcess:
        proc = ManagedProcess(name, ["sh", str(self.enter), *argv], self.workdir / f"{name}.log",
                              env=env)  # fmt: skip
        self.processes.append(proc)
        return proc

    def kubeconfig(self, name: str, user: str, group: str | None = None) -> Path:
        assert self.plane is not None
        pair = self.plane.ca.issue(name, user, organization=group)
        path = self.workdir / f"{name}.kubeconfig"
        write_kubeconfig(path, self.plane.network_server, self.plane.ca.cert_path, pair, user)
        return path

    def start_containerd(self, images: dict[str, Image]) -> float:
        config.write_containerd_config(self.paths, images["pause"].reference)
        config.write_cni_config(self.paths)
        containerd = self.spawn(
            "containerd", ["containerd", f"--config={self.paths.containerd_config}"]
        )
        socket = self.paths.containerd_socket
        _wait_for("containerd's socket", socket.exists, containerd, 30)
        return import_images(socket, images)

    def start_node_components(self) -> None:
        assert self.plane is not None
        ca = self.plane.ca.cert_path
        bins = self.bin_dir
        config.write_kubelet_config(self.paths, ca, self.state.cgroup)
        kubelet_kubeconfig = self.kubeconfig(
            "kubelet", f"system:node:{self.node_name}", "system:nodes"
        )
        self.spawn("kubelet", [
            str(bins / "kubelet"), f"--config={self.paths.kubelet_config}",
            f"--kubeconfig={kubelet_kubeconfig}", f"--root-dir={self.paths.kubelet_root}",
            f"--node-ip={config.NODE_ADDRESS}", f"--hostname-override={self.node_name}",
            "--v=1",
        ])  # fmt: skip
        proxy_kubeconfig = self.kubeconfig("kube-proxy", "system:kube-proxy")
        config.write_proxy_config(self.paths, proxy_kubeconfig, self.node_name)
        self.spawn("kube-proxy", [str(bins / "kube-proxy"), f"--config={self.paths.proxy_config}",
                                  "--v=1"])  # fmt: skip
        scheduler = self.kubeconfig("kube-scheduler", "system:kube-scheduler")
        self.spawn("kube-scheduler", [
            str(bins / "kube-scheduler"), f"--kubeconfig={scheduler}",
            f"--authentication-kubeconfig={scheduler}", f"--authorization-kubeconfig={scheduler}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--v=1",
        ])  # fmt: skip
        admin = self.plane.admin
        env = dict(os.environ, PYTHONPATH=str(TESTS_DIR))
        self.spawn("cluster-dns", [
            sys.executable, "-m", "support.realnode.dns", config.NODE_ADDRESS,
            self.plane.network_server, str(ca), str(admin.cert), str(admin.key),
        ], env=env)  # fmt: skip

    def node_ready(self) -> bool:
        assert self.plane is not None
        self.plane.check_alive()
        for proc in self.processes:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.log_tail()}")
        done = subprocess.run(
            self.plane.kubectl("get", "node", self.node_name, "-o", "json"),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            return False
        conditions = json.loads(done.stdout)["status"].get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def stop(self) -> None:
        if self.network is not None:
            self.network.close()
        for proc in reversed(self.processes):
            proc.stop(grace=2)
        if self.plane is not None:
            self.plane.stop()


def _keep_logs(workdir: Path) -> None:
    kept = Path(tempfile.mkdtemp(prefix="stabletrain-realnode-logs-"))
    for log in workdir.rglob("*.log"):
        if "pod-logs" not in log.parts:
            (kept / log.name).write_bytes(log.read_bytes())
    subprocess.run(["cp", "-r", str(workdir / "pod-logs"), str(kept)], check=False)
    print(f"real-node logs kept in {kept}")


@contextlib.contextmanager
def running_real_cluster(
    bin_dir: Path, image_names: tuple[str, ...] = ("base", "pause", "operator")
) -> Iterator[RealCluster]:
    """A control plane and a Ready real node with these images (the pause image always);
    everything stopped and restored on exit."""
    timings: dict[str, float] = {}
    began = time.monotonic()
    images = build_images(tuple(sorted({*image_names, "pause"})))
    timings["images"] = time.monotonic() - began
    with hoststate.exclusive_node():
        node_id = uuid.uuid4().hex[:8]
        workdir = Path(tempfile.mkdtemp(prefix=f"stabletrain-realnode-{node_id}-"))
        state = hoststate.HostState(node_id, os.getpid(), str(workdir), hoststate.read_sysctls())
        state.save()
        starter = _NodeStarter(state, workdir, bin_dir)
        try:
            began = time.monotonic()
            netns = starter.start_holder()
            starter.network = NodeNetwork(("sh", str(starter.enter)), netns)
            starter.plane = start_control_plane(workdir / "plane", bin_dir, starter.network)
            timings["control_plane"] = time.monotonic() - began
            began = time.monotonic()
            timings["image_import"] = starter.start_containerd(images)
            starter.start_node_components()
            _wait_for("the node to be Ready", starter.node_ready, None, 120)
            timings["node_ready"] = time.monotonic() - began
            yield RealCluster(
                starter.plane, starter.node_name, state, starter.paths, images, netns, timings
            )
        finally:
            try:
                starter.stop()
                if os.environ.get("STABLETRAIN_KEEP_LOGS"):
                    _keep_logs(workdir)
            finally:
                hoststate.restore(state)
