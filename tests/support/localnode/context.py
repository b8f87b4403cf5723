"""What every pod worker of one node shares: the API, the network, the disks, the timings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from support.localnode.api import RawApi
from support.localnode.hosts import Endpoint
from support.localnode.network import ClusterNetwork
from support.localnode.volumes import Storage


@dataclass(frozen=True)
class Backoff:
    initial: float = 1.0
    maximum: float = 10.0

    def delay(self, restarts: int) -> float:
        return float(min(self.maximum, self.initial * 2 ** max(0, restarts - 1)))


@dataclass
class NodeContext:
    """What every pod worker of one node shares."""

    api: RawApi
    node_name: str
    host_ip: str
    network: ClusterNetwork
    storage: Storage
    marker: str
    endpoints: Callable[[], tuple[int, Sequence[Endpoint]]]
    base_env: dict[str, str]
    backoff: Backoff = field(default_factory=Backoff)
    read_only_claims: set[tuple[str, str]] = field(default_factory=set)
    """(namespace, claim) pairs whose volume containers get read-only (a PFS outage); one
    set shared by every node of a cluster."""

    @property
    def pods_dir(self) -> Path:
        return self.storage.node_dir / "pods"

    @property
    def logs_dir(self) -> Path:
        return self.storage.node_dir / "logs"
