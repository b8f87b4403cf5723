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

import argparse
import importlib
import logging

import kopf

from stabletrain_agent.contract import env
from stabletrain_operator import metrics, pods
from stabletrain_operator.jobview import DEFAULT_PROGRESS_WRITE_SECONDS
from stabletrain_operator.observe.pacing import DEFAULT_SCRAPE_RATE
from stabletrain_operator.remediation import NodeRemediation


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
        type=NodeRemediation.parse,
        default=None,
        metavar="Taint:N|Cordon:N",
        help="taint or cordon a node once it was the culprit of N incidents of one job "
        "(needs get/patch on nodes; off by default)",
    )
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
    importlib.import_module("stabletrain_operator.register_handlers")  # registers the handlers
    if args.kueue:  # its watches need Kueue's CRDs, so they exist only when asked for
        importlib.import_module("stabletrain_operator.handlers.workloads")
    pods.set_agent_port(args.agent_port)
    metrics.serve(args.metrics_port)
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = bool(args.namespace)
    kopf.run(
        registry=kopf.get_default_registry(),
        settings=settings,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness or None,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        memo=kopf.Memo(
            remediation=args.remediate_nodes,
            progress_write_seconds=args.progress_write_seconds,
            scrape_rate=args.scrape_rate,
        ),
    )


if __name__ == "__main__":
    run()
