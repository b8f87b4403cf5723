"""`python -m stabletrain_operator`: the operator with its metrics port and liveness probe.

Standalone (no peering) by default; `--peering NAME` joins kopf's peering for HA replicas
(only one replica handles jobs at a time; needs kopf's peering CRD installed), and
`--priority N` tells the replicas apart: kopf pauses every replica but the highest, and all
of them when two share the highest.

With `--namespace`, kopf's cluster scanning (listing and watching all namespaces and CRDs)
is off: a namespaced release has no right to it, and kopf retried the refused lists for
about a minute before falling back to the namespaces given, which it now serves at once.
"""

from __future__ import annotations

# isort: off
import stabletrain_operator.client_libraries_off  # noqa: F401  (before kopf: see the module)

# isort: on
import argparse
import dataclasses
import importlib
import logging
from collections.abc import Callable
from typing import TypeVar

import kopf

from stabletrain_contract import env
from stabletrain_operator import apiserver, metrics, pods
from stabletrain_operator.jobview import DEFAULT_PROGRESS_WRITE_SECONDS
from stabletrain_operator.observe.pacing import DEFAULT_SCRAPE_RATE
from stabletrain_operator.remediation import DEFAULT_MIN_JOBS, NodeRemediation, NodeVotes
from stabletrain_operator.tenancy import limits, network_policy
from stabletrain_operator.tenancy.limits import PodSecurityLevel, TenancySettings
from stabletrain_operator.tenancy.network_policy import NetworkSettings

T = TypeVar("T")


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate > 0 (scrapes a second)")
    return value


def _checked(parse: Callable[[str], T]) -> Callable[[str], T]:
    """A flag's parser whose ValueError argparse shows as it is (it names the problem)."""

    def parse_flag(text: str) -> T:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse_flag


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"--remediate-min-jobs must be at least 1, got {value}")
    return value


def _tenancy_arguments(parser: argparse.ArgumentParser) -> None:
    """What a job may ask of the cluster (tenancy/limits.py, docs/operations.md)."""
    defaults = TenancySettings()
    parser.add_argument(
        "--host-path-prefixes",
        type=_checked(limits.parse_host_path_prefixes),
        default=defaults.host_path_prefixes,
        help="comma-separated node directories spec.checkpoints.local.hostPath may name; each "
        "job gets <prefix>/<namespace>/<job> below the one it names; empty: no hostPath "
        f"(default {','.join(defaults.host_path_prefixes)})",
    )
    parser.add_argument(
        "--local-volume-types",
        type=_checked(limits.parse_volume_types),
        default=defaults.local_volume_types,
        help="comma-separated core/v1 volume sources spec.checkpoints.local.volume may use; "
        f"empty: none (default {','.join(sorted(defaults.local_volume_types))})",
    )
    parser.add_argument(
        "--pod-security",
        type=PodSecurityLevel,
        choices=list(PodSecurityLevel),
        default=defaults.pod_security,
        help="the Pod Security Standard every worker template must meet, checked before any "
        f"pod is created (default {defaults.pod_security})",
    )
    parser.add_argument(
        "--network-policy",
        action=argparse.BooleanOptionalAction,
        default=defaults.network.enabled,
        help="give every job a NetworkPolicy of its own (default on)",
    )
    parser.add_argument(
        "--agent-peers",
        type=_checked(network_policy.parse_peers),
        default=(),
        help="JSON list of NetworkPolicyPeers that may reach the agent port of the jobs' "
        "pods (the operator's pods, Prometheus); none: nobody",
    )
    parser.add_argument(
        "--network-policy-extra-ingress",
        type=_checked(network_policy.parse_ingress),
        default=(),
        help="JSON list of NetworkPolicyIngressRules added to every job's policy",
    )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stabletrain-operator", description=__doc__)
    parser.add_argument(
        "--namespace", action="append", default=[], help="watch only these (repeatable)"
    )
    parser.add_argument("--peering", default=None, help="kopf peering name for HA replicas")
    parser.add_argument(
        "--priority", type=int, default=None, help="kopf peering priority (distinct per replica)"
    )
    parser.add_argument("--metrics-port", type=int, default=8000)
    parser.add_argument(
        "--agent-port",
        type=int,
        default=env.DEFAULT_AGENT_PORT,
        help="port of the agent's HTTP server in the training pods the operator creates",
    )
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="kopf liveness endpoint URL; empty disables it",
    )
    parser.add_argument(
        "--remediate-nodes",
        type=_checked(NodeRemediation.parse),
        default=None,
        metavar="Taint:N|Cordon:N",
        help="taint or cordon a node once it lost the pods of jobs N times (needs get/patch "
        "on nodes; off by default)",
    )
    parser.add_argument(
        "--remediate-min-jobs",
        type=_checked(_at_least_one),
        default=DEFAULT_MIN_JOBS,
        help="different jobs those N node losses must come from "
        f"(default {DEFAULT_MIN_JOBS}: one tenant cannot take a node out)",
    )
    _tenancy_arguments(parser)
    parser.add_argument(
        "--progress-write-seconds",
        type=_seconds,
        default=DEFAULT_PROGRESS_WRITE_SECONDS,
        help="least time between two status writes that only move step, loss, grad norm and "
        "throughput (decisions are written at once)",
    )
    parser.add_argument(
        "--scrape-rate",
        type=_rate,
        default=DEFAULT_SCRAPE_RATE,
        help="most agent status scrapes a second shared by every healthy job (each job's round "
        "is every max(1 s, pods / rate); the rate is lowered while the operator's event loop "
        "lags; jobs confirming a rollback, with a signal firing or a pod failed stay at 1 s)",
    )
    parser.add_argument(
        "--kueue",
        action="store_true",
        help="run jobs carrying the kueue.x-k8s.io/queue-name label only while Kueue admits "
        "their Workload (Kueue configured with integrations.externalFrameworks: "
        "StableTrainingJob.v1alpha1.stabletrain.dev); off: such jobs start at once",
    )
    parser.add_argument("--verbose", action="store_true")
    return parser.parse_args()


def run() -> None:
    args = _arguments()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kopf").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    apiserver.quiet_pool_overflow()
    importlib.import_module("stabletrain_operator.register_handlers")  # registers the handlers
    if args.kueue:  # its watches need Kueue's CRDs, so they exist only when asked for
        importlib.import_module("stabletrain_operator.handlers.workloads")
    pods.set_agent_port(args.agent_port)
    metrics.serve(args.metrics_port)
    kopf_settings = kopf.OperatorSettings()
    kopf_settings.scanning.disabled = bool(args.namespace)
    remediation = args.remediate_nodes
    if remediation is not None:
        remediation = dataclasses.replace(remediation, jobs=args.remediate_min_jobs)
    tenancy = TenancySettings(
        host_path_prefixes=args.host_path_prefixes,
        local_volume_types=args.local_volume_types,
        pod_security=args.pod_security,
        network=NetworkSettings(
            enabled=args.network_policy,
            agent_peers=args.agent_peers,
            extra_ingress=args.network_policy_extra_ingress,
        ),
    )
    kopf.run(
        registry=kopf.get_default_registry(),
        settings=kopf_settings,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness or None,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        memo=kopf.Memo(
            remediation=remediation,
            node_votes=NodeVotes(),
            tenancy=tenancy,
            progress_write_seconds=args.progress_write_seconds,
            scrape_rate=args.scrape_rate,
        ),
    )


if __name__ == "__main__":
    run()
