"""Run a control plane and a real node until SIGTERM or SIGINT (from tests/, or with tests/ on
PYTHONPATH):

    python -m support.realnode            # prints the kubeconfig once the node is Ready
    python -m support.realnode --restore  # restores what a SIGKILLed run left, checks the host

On SIGTERM/SIGINT every process stops and every piece of host state is restored. After a
SIGKILL the next start (or --restore) does it: the host state was recorded before it changed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from types import FrameType

from support.realnode import hoststate
from support.realnode.node import running_real_cluster
from support.realnode.requirements import node_binaries, unavailable_reason


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m support.realnode", description=__doc__)
    parser.add_argument("--restore", action="store_true", help="restore orphans and exit")
    parser.add_argument("--images", default="base,pause,operator", help="images to import")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    arguments = _parse(sys.argv[1:] if argv is None else argv)
    reason = unavailable_reason()
    if reason is not None:
        print(f"no real node on this machine: {reason}", file=sys.stderr)
        return 2
    if arguments.restore:
        with hoststate.exclusive_node():
            pass  # taking the lock restores every orphan
        print("restored; no real node state remains", flush=True)
        return 0
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    images = tuple(name for name in arguments.images.split(",") if name)
    with running_real_cluster(node_binaries(), images) as cluster:
        print(json.dumps({
            "node": cluster.node_name, "node_id": cluster.state.node_id,
            "kubeconfig": str(cluster.plane.kubeconfig), "workdir": cluster.state.workdir,
            "netns": str(cluster.netns),
            "timings_seconds": {k: round(v, 1) for k, v in cluster.timings.items()},
            "images": {i.name: i.reference for i in cluster.images.values()},
        }), flush=True)  # fmt: skip
        # A timed wait: a signal delivered to another thread does not wake a bare wait().
        while not stop.wait(0.5):
            pass
        print("stopping the node and restoring the host", flush=True)
    print("real node stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
