"""LocalCluster: nodes, a scheduler and pod workers for a real control plane, in one object.

One sync loop lists nodes, pods and EndpointSlices a few times a second (simple, no watch to
resume, and fast enough that the operator sees status changes well within a second), binds
pending pods, hands each pod bound to one of its nodes to that pod's worker, and refreshes the
cluster-DNS view every pod's /etc/hosts is built from.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from kubernetes import client

from support.localnode.api import Json, RawApi, pod_path
from support.localnode.binder import Binder
from support.localnode.context import Backoff, NodeContext
from support.localnode.hosts import Endpoint, headless_endpoints
from support.localnode.network import ClusterNetwork
from support.localnode.node import NODE_LABEL, NodeAgent
from support.localnode.pod_worker import PodWorker
from support.localnode.registry import CREATED
from support.localnode.sweep import kill_marked
from support.localnode.volumes import Storage

log = logging.getLogger(__name__)

SYNC_SECONDS = 0.2
STOP_JOIN_SECONDS = 30.0
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def default_env() -> dict[str, str]:
    """What an image's config would provide: PATH with this project's venv first, HOME."""
    venv_bin = Path(sys.executable).parent
    return {"PATH": f"{venv_bin}:{STANDARD_PATH}", "HOME": "/root", "LANG": "C.UTF-8"}


class _EndpointBook:
    """The current headless-Service endpoints, with a version that moves when they change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._endpoints: list[Endpoint] = []

    def replace(self, endpoints: list[Endpoint]) -> None:
        with self._lock:
            if endpoints != self._endpoints:
                self._endpoints = endpoints
                self._version += 1

    def snapshot(self) -> tuple[int, Sequence[Endpoint]]:
        with self._lock:
            return self._version, list(self._endpoints)


class LocalCluster:
    """Registers `nodes` on the control plane behind `api_client` and runs their pods.

    `root` holds each node's hostPath tree (`nodes/<node>/host`, its "NVMe"), the shared claim
    tree (`shared/<namespace>/<claim>`, the "PFS"), pod scratch space and container logs. When
    no root is given a temporary one is made and removed on close; a given root is kept (the
    demo inspects it) except for per-pod scratch space. STABLETRAIN_KEEP_LOGS=1 keeps a
    temporary root too, for its container logs.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        nodes: Sequence[str] = ("node-a", "node-b"),
        root: Path | None = None,
        *,
        node_labels: Mapping[str, Mapping[str, str]] | None = None,
        restart_backoff: Backoff | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not nodes or len(set(nodes)) != len(nodes):
            raise ValueError(f"nodes must be distinct names, got {list(nodes)}")
        self.api = RawApi(api_client)
        self.node_names = tuple(nodes)
        self._owns_root = root is None
        self.root = (
            Path(tempfile.mkdtemp(prefix="stabletrain-localnode-")) if root is None else root
        )
        self.marker = f"localnode-{uuid.uuid4().hex[:12]}"
        self._node_labels = node_labels or {}
        self._backoff = restart_backoff or Backoff()
        self._env = {**default_env(), **(env or {})}
        self._agents: dict[str, NodeAgent] = {}
        self._contexts: dict[str, NodeContext] = {}
        self._lost: set[str] = set()
        self._lost_pods: dict[str, set[str]] = {}
        self._read_only_claims: set[tuple[str, str]] = set()
        self._workers: dict[str, tuple[str, PodWorker]] = {}
        self._retired: set[str] = set()
        self._binder = Binder(self.api)
        self._endpoints = _EndpointBook()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._loop = threading.Thread(target=self._sync_forever, name="localnode-sync", daemon=True)
        self.network: ClusterNetwork | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Network, then nodes, then the loop; anything half-made is undone on failure."""
        CREATED.markers.append(self.marker)
        if self._owns_root:
            CREATED.directories.append(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.shared_dir.mkdir(exist_ok=True)
            self.network = self._unshared_network()
            host_ip = str(self.network.host_address)
            for name in self.node_names:
                agent = NodeAgent(self.api, name, host_ip, dict(self._node_labels.get(name, {})))
                agent.register()
                self._agents[name] = agent
                storage = Storage(self.node_dir(name), self.shared_dir)
                self._contexts[name] = NodeContext(
                    self.api, name, host_ip, self.network, storage, self.marker,
                    self._endpoints.snapshot, self._env, self._backoff,
                    self._read_only_claims,
                )  # fmt: skip
            self._loop.start()
        except BaseException:
            self.stop()
            raise

    def _unshared_network(self, attempts: int = 5) -> ClusterNetwork:
        for _ in range(attempts):
            network = ClusterNetwork(self.root, self.marker)
            if not network.shares_its_subnet():
                return network
            network.stop()
        raise RuntimeError(f"no pod subnet of its own after {attempts} attempts")

    def stop(self) -> None:
        """Stops every pod, deregisters the nodes, removes the network and the scratch dirs."""
        self._stop.set()
        if self._loop.is_alive():
            self._loop.join(STOP_JOIN_SECONDS)
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for _, worker in workers:
            worker.shutdown()
        for _, worker in workers:
            worker.join(STOP_JOIN_SECONDS)
        self._forget_pods_of_our_nodes()
        for agent in self._agents.values():
            with contextlib.suppress(Exception):
                agent.deregister()
        self._agents.clear()
        kill_marked(self.marker)
        if self.network is not None:
            self.network.stop()
            self.network = None
        if self._owns_root and os.environ.get("STABLETRAIN_KEEP_LOGS"):
            print(f"local node logs kept in {self.root}")
        elif self._owns_root:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            for name in self.node_names:
                shutil.rmtree(self.node_dir(name) / "pods", ignore_errors=True)

    def _forget_pods_of_our_nodes(self) -> None:
        """Pods left on nodes that are about to vanish are removed as PodGC would, at once."""
        with contextlib.suppress(Exception):
            for pod in self.api.items("/api/v1/pods"):
                if pod["spec"].get("nodeName") in self.node_names:
                    metadata = pod["metadata"]
                    self.api.delete(
                        pod_path(metadata["namespace"], metadata["name"]),
                        {"gracePeriodSeconds": 0, "preconditions": {"uid": metadata["uid"]}},
                    )

    # -- what tests and the demo use -----------------------------------------------------
    @property
    def shared_dir(self) -> Path:
        """The "PFS": every PersistentVolumeClaim is `shared_dir/<namespace>/<claim>`."""
        return self.root / "shared"

    def node_dir(self, node: str) -> Path:
        return self.root / "nodes" / node

    def host_path(self, node: str, path: str) -> Path:
        """Where a hostPath volume of pods on `node` lives (the node's "NVMe")."""
        return self.node_dir(node) / "host" / path.lstrip("/")

    def logs(self, namespace: str, pod: str, container: str | None = None) -> str:
        """Output of the pod's containers (all runs, oldest first), also after the pod is gone."""
        texts = []
        for node in self.node_names:
            base = self.node_dir(node) / "logs"
            for path in sorted(base.glob(f"{namespace}_{pod}_*/*.log"), key=_mtime):
                if container is None or path.name.rsplit("-", 1)[0] == container:
                    texts.append(path.read_text(errors="replace"))
        return "".join(texts)

    def lose_node(self, name: str) -> None:
        """The node dies: heartbeats stop, its processes are killed, no status is written."""
        if name not in self._agents:
            raise ValueError(f"unknown node {name}; this cluster has {list(self.node_names)}")
        with self._lock:
            self._lost.add(name)
            doomed = [(uid, w) for uid, (node, w) in self._workers.items() if node == name]
            for uid, _ in doomed:
                del self._workers[uid]
                self._retired.add(uid)
            self._lost_pods.setdefault(name, set()).update(uid for uid, _ in doomed)
        self._agents[name].stop_heartbeats()
        for _, worker in doomed:
            worker.lose()
        for _, worker in doomed:
            worker.join(STOP_JOIN_SECONDS)

    def restore_node(self, name: str) -> list[str]:
        """A lost node comes back (the same boot: its heartbeats resume, Ready again).

        Pods it lost that the control plane has marked for deletion meanwhile (the eviction
        after `unreachable`) get a worker again, which finalizes them as a returning kubelet
        does: their processes are long gone. A lost pod that was not marked for deletion is
        left as it is (a kubelet would report its vanished container; that is not modelled):
        wait at least --node-monitor-grace-period plus the pods' toleration before restoring.
        Returns those left pods' names.
        """
        if name not in self._lost:
            raise ValueError(f"node {name} is not lost; lost: {sorted(self._lost)}")
        lost_pods = self._lost_pods.pop(name, set())
        left = []
        for pod in self.api.items("/api/v1/pods", {"fieldSelector": f"spec.nodeName={name}"}):
            metadata = pod["metadata"]
            if metadata["uid"] in lost_pods and not metadata.get("deletionTimestamp"):
                left.append(f"{metadata['namespace']}/{metadata['name']}")
                lost_pods.discard(metadata["uid"])
        with self._lock:
            self._retired -= lost_pods
            self._lost.discard(name)
        self._agents[name].resume_heartbeats()
        return left

    def pod_processes(self, namespace: str, pod: str) -> list[int]:
        """PIDs (as this host numbers them) of every live process of the pod on our nodes."""
        with self._lock:
            workers = [w for _, w in self._workers.values() if w.name == f"{namespace}/{pod}"]
        return [pid for worker in workers for pid in worker.processes()]

    def set_claim_read_only(self, namespace: str, claim: str, read_only: bool) -> list[str]:
        """The claim's volume (the "PFS") read-only, or writable again, for the containers of
        every pod that mounts it: remounted inside the running ones (see localnode/remount.py),
        and mounted so in those that start meanwhile. Returns "ns/pod container:mountPath" of
        each running container changed."""
        key = (namespace, claim)
        with self._lock:
            if read_only:
                self._read_only_claims.add(key)
            else:
                self._read_only_claims.discard(key)
            workers = [w for _, w in self._workers.values()]
        done = []
        for worker in workers:
            done += [f"{worker.name} {where}" for where in worker.remount_claim(key, read_only)]
        return done

    # -- the sync loop -------------------------------------------------------------------
    def _sync_forever(self) -> None:
        while not self._stop.wait(SYNC_SECONDS):
            try:
                self._sync_once()
            except Exception as error:  # the loop outlives any one failed request
                log.warning("local cluster sync failed: %s", error)

    def _sync_once(self) -> None:
        slices = self.api.items("/apis/discovery.k8s.io/v1/endpointslices")
        self._endpoints.replace(headless_endpoints(slices))
        nodes = self.api.items("/api/v1/nodes", {"labelSelector": f"{NODE_LABEL}=true"})
        live = [n for n in nodes if n["metadata"]["name"] in self._contexts]
        live = [n for n in live if n["metadata"]["name"] not in self._lost]
        pods = self.api.items("/api/v1/pods")
        self._binder.schedule(pods, live)
        self._dispatch(pods)

    def _dispatch(self, pods: list[Json]) -> None:
        seen = set()
        with self._lock:
            for pod in pods:
                node = pod["spec"].get("nodeName")
                uid = pod["metadata"]["uid"]
                if node not in self._contexts or node in self._lost or uid in self._retired:
                    continue
                seen.add(uid)
                if uid in self._workers:
                    self._workers[uid][1].offer(pod)
                    continue
                worker = PodWorker(self._contexts[node], pod)
                self._workers[uid] = (node, worker)
                worker.start()
            for uid, (_, worker) in list(self._workers.items()):
                if uid not in seen:
                    worker.gone()
                if not worker.thread.is_alive() or uid not in seen:
                    del self._workers[uid]
                    self._retired.add(uid)


def _mtime(path: Path) -> float:
    return path.stat().st_mtime
