"""A real Kubernetes control plane for the tests: etcd, kube-apiserver, kube-controller-manager.

The binaries are upstream ones built by `make k8s-bins`. The API server runs with real TLS,
client-certificate authentication, RBAC authorization and service-account signing keys, and
kube-controller-manager runs beside it so that ownerReference garbage collection, namespace
deletion, service-account creation and node lifecycle behave as in a real cluster. The Node
authorizer and `--kubelet-preferred-address-types=InternalIP` are on, as a real kubelet needs
(tests/support/realnode).

Every address is on loopback, or, for a real node, inside a network namespace the test made
(a `PlaneNetwork`); every process dies with the test run (see processes.py).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from support.pki import CertificateAuthority, KeyPair, service_account_key
from support.processes import ManagedProcess, free_port

CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
SERVICE_CIDR = "10.0.0.0/24"
"""Allocated from; only dialled on a real node, whose kube-proxy serves ClusterIPs."""
KUBERNETES_SERVICE_IP = "10.0.0.1"
"""The `kubernetes` Service's ClusterIP (the range's first address): pods dial it."""


class PlaneNetwork(Protocol):
    """Where the control plane listens and how the test process reaches it."""

    @property
    def address(self) -> str:
        """The address the API server binds and advertises (the `kubernetes` endpoint)."""
        ...

    @property
    def launcher(self) -> tuple[str, ...]:
        """argv prefix that runs a component inside this network."""
        ...

    def reach(self, host: str, port: int) -> int:
        """A port on this process's loopback that reaches `host:port` inside the network."""
        ...


class LoopbackNetwork:
    """The default: everything on this host's loopback, reached directly."""

    address = "127.0.0.1"
    launcher: tuple[str, ...] = ()

    def reach(self, host: str, port: int) -> int:
        return port


LOOPBACK = LoopbackNetwork()


def binary_dir(required: tuple[str, ...] = CONTROL_PLANE_BINARIES) -> Path:
    """Where `make k8s-bins` put the binaries; fails with what to run when they are missing."""
    default = Path.home() / ".cache" / "stabletrain" / "k8s" / "v1.34.4"
    directory = Path(os.environ.get("STABLETRAIN_K8S_BIN_DIR", default))
    missing = [name for name in required if not (directory / name).exists()]
    if missing:
        raise RuntimeError(
            f"Kubernetes test binaries missing in {directory}: {', '.join(missing)}. "
            "Run `make k8s-bins` (or `make test`, which does it first)."
        )
    return directory


@dataclass
class ControlPlane:
    """A running control plane and what a client needs to reach it."""

    workdir: Path
    bin_dir: Path
    server: str
    """The API server's URL for this process (a forwarded port when in a namespace)."""
    kubeconfig: Path
    ca: CertificateAuthority
    admin: KeyPair
    sa_private_key: Path
    network_server: str = ""
    """The API server's URL inside its network: what nodes and pods dial."""
    processes: list[ManagedProcess] = field(default_factory=list)
    started_in_seconds: float = 0.0

    def kubectl(self, *args: str) -> list[str]:
        """argv of a kubectl call as the admin."""
        return [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]

    def env(self) -> dict[str, str]:
        """The environment a child process needs to talk to this cluster as the admin."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.bin_dir}:{env.get('PATH', '')}"
        return env

    def check_alive(self) -> None:
        """Raises with the log tail of any component that died."""
        for proc in self.processes:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.log_tail()}")

    def restart_apiserver(self, down_seconds: float = 0.0, timeout: float = 90.0) -> float:
        """kube-apiserver stopped (SIGTERM, then SIGKILL after 5 s) and started again with the
        same flags, port and certificates after `down_seconds`; etcd keeps running and keeps
        the data. Returns the seconds from the stop until /readyz answered again.

        Like every child here it dies with the thread that starts it (processes.py): call
        this from a thread that lives as long as the control plane.
        """
        index = next(i for i, p in enumerate(self.processes) if p.name == "kube-apiserver")
        old = self.processes[index]
        began = time.monotonic()
        old.stop()
        time.sleep(down_seconds)
        new = ManagedProcess(old.name, old.argv, old.log_path, env=old.env, cwd=old.cwd)
        self.processes[index] = new
        admin = _client_context(self.ca.cert_path, self.admin)
        _wait_healthy(f"{self.server}/readyz", new, admin, timeout)
        return time.monotonic() - began

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()


def write_kubeconfig(path: Path, server: str, ca: Path, client: KeyPair, user: str) -> None:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: stabletrain-test
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    client-certificate: {client.cert}
    client-key: {client.key}
contexts:
- name: stabletrain-test
  context:
    cluster: stabletrain-test
    user: {user}
current-context: stabletrain-test
"""
    )


def _wait_healthy(
    url: str, proc: ManagedProcess, context: ssl.SSLContext | None, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    last_error = ""
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited while starting:\n{proc.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError) as error:
            last_error = str(error)
        time.sleep(0.1)
    raise RuntimeError(
        f"{proc.name} not healthy at {url} after {timeout} s ({last_error}):\n{proc.log_tail()}"
    )


def _client_context(ca: Path, client: KeyPair) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(client.cert), str(client.key))
    return context


def start_control_plane(
    workdir: Path, bin_dir: Path | None = None, network: PlaneNetwork = LOOPBACK
) -> ControlPlane:
    """Starts etcd, kube-apiserver and kube-controller-manager and waits until each is healthy.

    On any failure everything already started is stopped before the error propagates.
    """
    began = time.monotonic()
    bin_dir = bin_dir or binary_dir()
    pki_dir = workdir / "pki"
    pki_dir.mkdir(parents=True)
    ca = CertificateAuthority(pki_dir)
    apiserver_port = free_port()
    network_server = f"https://{network.address}:{apiserver_port}"
    server = f"https://127.0.0.1:{network.reach(network.address, apiserver_port)}"
    serving = ca.issue(
        "apiserver",
        "kube-apiserver",
        server_ips=tuple(dict.fromkeys(("127.0.0.1", network.address, KUBERNETES_SERVICE_IP))),
        server_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
    )
    admin = ca.issue("admin", "admin", organization="system:masters")
    # How the API server authenticates to kubelets (logs, exec, port-forward).
    kubelet_client = ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                              organization="system:masters")  # fmt: skip
    sa_private, sa_public = service_account_key(pki_dir)
    kubeconfig = workdir / "admin.kubeconfig"
    write_kubeconfig(kubeconfig, server, ca.cert_path, admin, "admin")
    network_kubeconfig = kubeconfig
    if network_server != server:
        network_kubeconfig = workdir / "admin-in-network.kubeconfig"
        write_kubeconfig(network_kubeconfig, network_server, ca.cert_path, admin, "admin")

    plane = ControlPlane(workdir, bin_dir, server, kubeconfig, ca, admin, sa_private)
    plane.network_server = network_server
    launcher = network.launcher
    try:
        etcd_port, etcd_peer = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        etcd = ManagedProcess(
            "etcd",
            [
                *launcher,
                str(bin_dir / "etcd"),
                f"--data-dir={workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            workdir / "etcd.log",
        )
        plane.processes.append(etcd)
        etcd_reached = network.reach("127.0.0.1", etcd_port)
        _wait_healthy(f"http://127.0.0.1:{etcd_reached}/health", etcd, None, timeout=30)

        apiserver = ManagedProcess(
            "kube-apiserver",
            [
                *launcher,
                str(bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--cert-dir={pki_dir}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.cert_path}",
                f"--secure-port={apiserver_port}",
                f"--bind-address={network.address}",
                f"--advertise-address={network.address}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                # Node: what a kubelet (system:node:<name>) may read and write, as in a cluster.
                "--authorization-mode=Node,RBAC",
                # A node is dialled at its InternalIP: its hostname resolves nowhere here.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                f"--service-account-issuer={server}",
                f"--service-account-key-file={sa_public}",
                f"--service-account-signing-key-file={sa_private}",
                "--api-audiences=" + server,
                # A lost node's pods are evicted after seconds, not the default 5 minutes.
                "--default-not-ready-toleration-seconds=5",
                "--default-unreachable-toleration-seconds=5",
                "--profiling=false",
                "--v=1",
            ],
            workdir / "kube-apiserver.log",
        )
        plane.processes.append(apiserver)
        admin_context = _client_context(ca.cert_path, admin)
        _wait_healthy(f"{server}/readyz", apiserver, admin_context, timeout=90)

        kcm_port = free_port()
        controller_manager = ManagedProcess(
            "kube-controller-manager",
            [
                *launcher,
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={network_kubeconfig}",
                f"--authentication-kubeconfig={network_kubeconfig}",
                f"--authorization-kubeconfig={network_kubeconfig}",
                f"--service-account-private-key-file={sa_private}",
                f"--root-ca-file={ca.cert_path}",
                f"--cluster-signing-cert-file={ca.cert_path}",
                f"--cluster-signing-key-file={ca.key_path}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--cert-dir={workdir / 'kcm-certs'}",
                "--use-service-account-credentials=true",
                # Node lifecycle on a test clock: NotReady after 10 s without heartbeats.
                "--node-monitor-period=1s",
                "--node-monitor-grace-period=10s",
                "--v=1",
            ],
            workdir / "kube-controller-manager.log",
        )
        plane.processes.append(controller_manager)
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        kcm_reached = network.reach("127.0.0.1", kcm_port)
        _wait_healthy(f"https://127.0.0.1:{kcm_reached}/healthz", controller_manager, insecure, 60)
    except BaseException:
        plane.stop()
        raise
    plane.started_in_seconds = time.monotonic() - began
    return plane


_WORKDIR_PREFIX = "stabletrain-cp-"
_OWNER_FILE = "owner.pid"


def _remove_orphaned_workdirs() -> None:
    """Removes the directories of earlier runs whose owner died without cleaning up (SIGKILL).

    Their processes are already gone (they die with their parent); only the files remain.
    """
    for candidate in Path(tempfile.gettempdir()).glob(f"{_WORKDIR_PREFIX}*"):
        try:
            owner = int((candidate / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not Path(f"/proc/{owner}").exists():
            shutil.rmtree(candidate, ignore_errors=True)


@contextlib.contextmanager
def running_control_plane(network: PlaneNetwork = LOOPBACK) -> Iterator[ControlPlane]:
    """A control plane in a fresh temp dir; stopped and the dir removed on any exit.

    Set STABLETRAIN_KEEP_LOGS=1 to keep the directory (its logs) after a failed run.
    """
    _remove_orphaned_workdirs()
    workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
    (workdir / _OWNER_FILE).write_text(str(os.getpid()))
    plane: ControlPlane | None = None
    try:
        plane = start_control_plane(workdir, network=network)
        yield plane
    finally:
        if plane is not None:
            plane.stop()
        if os.environ.get("STABLETRAIN_KEEP_LOGS"):
            print(f"control-plane logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


_REQUEST_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def request_counts(plane: ControlPlane) -> collections.Counter[tuple[str, str, str]]:
    """The API server's own apiserver_request_total so far, summed by (verb, resource,
    subresource): what every client cost it, read as the admin."""
    context = ssl.create_default_context(cafile=str(plane.ca.cert_path))
    context.load_cert_chain(str(plane.admin.cert), str(plane.admin.key))
    with urllib.request.urlopen(plane.server + "/metrics", context=context, timeout=30) as reply:
        text = reply.read().decode()
    counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for line in text.splitlines():
        found = _REQUEST_SAMPLE.match(line)
        if found is None:
            continue
        labels = dict(_LABEL.findall(found.group("labels")))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        counts[key] += int(float(found.group("value")))
    return counts
