"""A standby worker: torch and the agent imported, waiting to become `python -u <script>`.

torchrun starts each worker as `<python> -u <script> <args>` (or `-m <module>`); handed
that command line and its environment (order.py), this process runs the script exactly as
that interpreter would have: `__main__`, `sys.argv`, `sys.path[0]`, unbuffered output.
"""

from __future__ import annotations

import os
import runpy
import sys

import torch
import torch._dynamo  # DDP's constructor (and FSDP, torch.compile) import it: 1.3 s of a start
import torch.distributed  # noqa: F401

import stabletrain_agent.guard  # noqa: F401 - the agent's torch side, which scripts import
from stabletrain_agent.warm.order import read_order, take_on


def main() -> None:
    order = read_order(sys.stdin)
    if order is None:
        return  # the launcher ended without needing this standby
    take_on(order)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    rest = [arg for arg in order.argv[1:]]
    while rest and rest[0] == "-u":
        rest = rest[1:]
    if rest[:1] == ["-m"]:
        sys.argv = rest[1:]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
        return
    script = rest[0]
    sys.argv = rest
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
