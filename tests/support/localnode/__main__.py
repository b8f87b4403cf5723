"""Run a local cluster against any API server until SIGTERM or SIGINT, for the demo.

    python -m support.localnode --kubeconfig K --nodes node-a,node-b --root DIR

(from tests/, or with tests/ on PYTHONPATH). Stops every pod, removes its nodes and network
and exits 0 on SIGTERM/SIGINT; the storage trees under DIR are kept.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from kubernetes import config

from support.localnode.cluster import LocalCluster


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m support.localnode", description=__doc__)
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--nodes", default="node-a,node-b", help="comma-separated node names")
    parser.add_argument("--root", required=True, type=Path, help="node and shared storage")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    arguments = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    nodes = [name.strip() for name in arguments.nodes.split(",") if name.strip()]
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    api_client = config.new_client_from_config(config_file=str(arguments.kubeconfig))  # type: ignore[no-untyped-call]
    with LocalCluster(api_client, nodes=nodes, root=arguments.root) as cluster:
        assert cluster.network is not None
        print(
            f"local cluster up: nodes {','.join(nodes)}; pod network {cluster.network.subnet} "
            f"(host {cluster.network.host_address}, link {cluster.network.uplink}); "
            f"marker {cluster.marker}; storage in {arguments.root}",
            flush=True,
        )
        stop.wait()
        print("stopping: pods, nodes, network", flush=True)
    api_client.close()
    print("local cluster stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
