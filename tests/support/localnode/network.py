"""The pod network: one private /24 on a bridge that lives in a network namespace of its own.

Pods get a veth into that bridge, so every pod reaches every other pod by IP as on a flat
cluster network. The host gets one veth into the bridge too (its own address in the /24), so
that code on the host, the operator scraping a pod's metrics for instance, reaches pods the way
it would in a cluster; the /24 is routed nowhere else. Everything here disappears with the
holder processes (see namespaces.py).
"""

from __future__ import annotations

import ipaddress
import json
import random
import subprocess
import threading
import uuid
from pathlib import Path

from support.localnode.namespaces import NamespaceHolder
from support.localnode.registry import CREATED

POOL = ipaddress.IPv4Network("10.244.0.0/16")
"""Subnets are drawn from here; a /24 already routed on this host is never taken."""

BRIDGE = "br0"
UPLINK_PREFIX = "stln"
"""Host-side veth names start with this, so a leftover check can find ours."""


def _ip(*argv: str) -> None:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)} failed: {done.stderr.strip()}")


def _routed_networks() -> list[ipaddress.IPv4Network]:
    done = subprocess.run(
        ["ip", "-j", "-4", "route", "show", "table", "all"],
        capture_output=True,
        text=True,
        check=True,
    )
    networks = []
    for route in json.loads(done.stdout or "[]"):
        destination = route.get("dst", "")
        if destination and destination != "default":
            networks.append(ipaddress.ip_network(destination, strict=False))
    return [n for n in networks if isinstance(n, ipaddress.IPv4Network)]


def routes_to(subnet: ipaddress.IPv4Network) -> int:
    return sum(1 for network in _routed_networks() if network == subnet)


def pick_subnet(rng: random.Random | None = None) -> ipaddress.IPv4Network:
    """A /24 of the pool that no route on this host overlaps (other runs may hold some)."""
    taken = _routed_networks()
    candidates = list(POOL.subnets(new_prefix=24))
    (rng or random.Random()).shuffle(candidates)
    for subnet in candidates:
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise RuntimeError(f"every /24 of {POOL} is already routed on this host")


class ClusterNetwork:
    """Bridge + host uplink + address allocation for the pods of one local cluster."""

    def __init__(self, workdir: Path, marker: str) -> None:
        self.subnet = pick_subnet()
        hosts = list(self.subnet.hosts())
        self.gateway, self.host_address = hosts[0], hosts[-1]
        self._free = hosts[1:-1]
        self._lock = threading.Lock()
        self.uplink = f"{UPLINK_PREFIX}{uuid.uuid4().hex[:8]}"
        CREATED.links.append(self.uplink)
        self.holder = NamespaceHolder("pod-network", ["net"], workdir / "network.log", marker)
        try:
            self._build()
        except BaseException:
            self.holder.stop()
            raise

    def _build(self) -> None:
        prefix = self.subnet.prefixlen
        run = self.holder.run
        run("ip", "link", "set", "lo", "up")
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{self.gateway}/{prefix}", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        _ip("link", "add", self.uplink, "type", "veth", "peer", "name", "uplink", "netns",
            str(self.holder.pid))  # fmt: skip
        run("ip", "link", "set", "uplink", "master", BRIDGE, "up")
        _ip("addr", "add", f"{self.host_address}/{prefix}", "dev", self.uplink)
        _ip("link", "set", self.uplink, "up")

    def shares_its_subnet(self) -> bool:
        """True when another run took the same /24 at the same moment (both then retry)."""
        return routes_to(self.subnet) > 1

    def allocate(self) -> ipaddress.IPv4Address:
        with self._lock:
            if not self._free:
                raise RuntimeError(f"no free pod address left in {self.subnet}")
            return self._free.pop(0)

    def release(self, address: ipaddress.IPv4Address) -> None:
        with self._lock:
            self._free.append(address)

    def attach(self, sandbox: NamespaceHolder, address: ipaddress.IPv4Address, port: str) -> None:
        """Gives a pod sandbox eth0 with its address, wired into the bridge through `port`."""
        self.holder.run(
            "ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns",
            str(sandbox.pid),
        )  # fmt: skip
        self.holder.run("ip", "link", "set", port, "master", BRIDGE, "up")
        prefix = self.subnet.prefixlen
        sandbox.run("ip", "link", "set", "lo", "up")
        sandbox.run("ip", "addr", "add", f"{address}/{prefix}", "dev", "eth0")
        sandbox.run("ip", "link", "set", "eth0", "up")
        sandbox.run("ip", "route", "add", "default", "via", str(self.gateway))

    def stop(self) -> None:
        """The bridge and every pod's port vanish with the namespace; the kernel does that
        asynchronously, so the one link on the host side is deleted here, at once."""
        subprocess.run(["ip", "link", "del", self.uplink], capture_output=True, check=False)
        self.holder.stop()
