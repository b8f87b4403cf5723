"""Every job's own NetworkPolicy: who may connect to its pods.

The agent port serves the job's status and metrics without authentication and takes live
directives with the job's bearer token; the rendezvous store (torchrun's TCPStore) and the
collectives (gloo, NCCL sockets) take no credential at all. So the policy, selecting the
job's pods by its label, lets in:

- on the agent port, the peers the administrator names (`--agent-peers`: the operator's
  pods, and Prometheus when the chart's PodMonitor scrapes the agents), nobody else;
- on every other TCP port, the pods of the same job (a podSelector without a
  namespaceSelector: its own namespace only);
- whatever `--network-policy-extra-ingress` adds (a TensorBoard, a debugger).

Egress is left alone: training reads data and writes checkpoints wherever the cluster
keeps them. Without a CNI that enforces NetworkPolicies the object changes nothing
(docs/operations.md, "Multi-tenant clusters").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stabletrain_operator import naming
from stabletrain_operator.pods import JobRef

Json = dict[str, Any]
PEER_KEYS = frozenset({"podSelector", "namespaceSelector", "ipBlock"})
INGRESS_KEYS = frozenset({"from", "ports"})
HIGHEST_PORT = 65535


@dataclass(frozen=True)
class NetworkSettings:
    enabled: bool = True
    agent_peers: tuple[Json, ...] = ()
    """NetworkPolicyPeers allowed on the agent port; none: nobody may connect to it."""
    extra_ingress: tuple[Json, ...] = ()
    """More NetworkPolicyIngressRules for every job's pods."""


def _json_list(text: str, flag: str, keys: frozenset[str]) -> tuple[Json, ...]:
    try:
        items = json.loads(text) if text.strip() else []
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag}: not JSON: {error}") from None
    if not isinstance(items, list) or not all(isinstance(i, dict) and i for i in items):
        raise ValueError(f"{flag}: expected a JSON list of objects, got {text!r}")
    for item in items:
        unknown = sorted(set(item) - keys)
        if unknown:
            raise ValueError(
                f"{flag}: unknown key(s) {', '.join(unknown)} in {item} "
                f"(allowed: {', '.join(sorted(keys))})"
            )
    return tuple(items)


def parse_peers(text: str) -> tuple[Json, ...]:
    """`--agent-peers`: a JSON list of NetworkPolicyPeer objects."""
    return _json_list(text, "--agent-peers", PEER_KEYS)


def parse_ingress(text: str) -> tuple[Json, ...]:
    """`--network-policy-extra-ingress`: a JSON list of NetworkPolicyIngressRule objects."""
    return _json_list(text, "--network-policy-extra-ingress", INGRESS_KEYS)


def _tcp_range(first: int, last: int) -> list[Json]:
    if first > last:
        return []
    if first == last:
        return [{"protocol": "TCP", "port": first}]
    return [{"protocol": "TCP", "port": first, "endPort": last}]


def _own_pods_ports(agent_port: int) -> list[Json]:
    """Every TCP port but the agent's: torchrun's rendezvous and the collectives' sockets
    use ports chosen at run time."""
    return _tcp_range(1, agent_port - 1) + _tcp_range(agent_port + 1, HIGHEST_PORT)


def build_network_policy(job: JobRef, agent_port: int, settings: NetworkSettings) -> Json:
    own = {"matchLabels": {naming.JOB_LABEL: job.name}}
    ingress: list[Json] = [{"from": [{"podSelector": own}], "ports": _own_pods_ports(agent_port)}]
    if settings.agent_peers:
        ingress.append(
            {
                "from": [dict(peer) for peer in settings.agent_peers],
                "ports": [{"protocol": "TCP", "port": agent_port}],
            }
        )
    ingress += [dict(rule) for rule in settings.extra_ingress]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": job.metadata(naming.network_policy(job.name)),
        "spec": {"podSelector": own, "policyTypes": ["Ingress"], "ingress": ingress},
    }
