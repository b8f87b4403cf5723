"""`python -m stabletrain_operator`: the operator with its metrics port and liveness probe.

Standalone (no peering) by default; `--peering NAME` joins kopf's peering for HA replicas
(only one replica handles jobs at a time; needs kopf's peering CRD installed).
"""

from __future__ import annotations

import argparse
import importlib
import logging

import kopf

from stabletrain_operator import metrics


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stabletrain-operator", description=__doc__)
    parser.add_argument(
        "--namespace", action="append", default=[], help="watch only these (repeatable)"
    )
    parser.add_argument("--peering", default=None, help="kopf peering name for HA replicas")
    parser.add_argument("--metrics-port", type=int, default=8000)
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="kopf liveness endpoint URL; empty disables it",
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
    importlib.import_module("stabletrain_operator.main")  # registers the handlers
    metrics.serve(args.metrics_port)
    kopf.run(
        registry=kopf.get_default_registry(),
        standalone=args.peering is None,
        peering_name=args.peering,
        liveness_endpoint=args.liveness or None,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
    )


if __name__ == "__main__":
    run()
