"""The one order a standby interpreter takes: become this command, with this environment.

One JSON line on the standby's stdin. Torch-free, so the supervisor writes it without
importing what the standby imported.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO


@dataclass(frozen=True)
class Become:
    argv: tuple[str, ...]
    """The command line the standby stands in for (argv[0] included)."""
    env: Mapping[str, str]
    """The environment it would have been started with, whole."""
    stdout: str | None = None
    """A file its standard output goes to (torchrun's --redirects), else the inherited."""
    stderr: str | None = None

    def to_line(self) -> bytes:
        document: dict[str, object] = {"argv": list(self.argv), "env": dict(self.env)}
        document.update({"stdout": self.stdout, "stderr": self.stderr})
        return (json.dumps(document) + "\n").encode()


def read_order(stream: IO[str]) -> Become | None:
    """The order, or None when the stream ended first (the standby is not needed)."""
    line = stream.readline()
    if not line:
        return None
    document = json.loads(line)
    return Become(
        argv=tuple(str(a) for a in document["argv"]),
        env={str(k): str(v) for k, v in document["env"].items()},
        stdout=document.get("stdout"),
        stderr=document.get("stderr"),
    )


def take_on(order: Become) -> None:
    """The process takes on the order's environment and output files; its stdin, which
    carried the order, is /dev/null from now on, as a started process's would be."""
    os.environ.clear()
    os.environ.update(order.env)
    for path, fd in ((order.stdout, 1), (order.stderr, 2)):
        if path:
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def is_torchrun(argv: Sequence[str]) -> bool:
    """A command torchrun runs: `torchrun ...` or `python -m torch.distributed.run ...`."""
    if not argv:
        return False
    if os.path.basename(argv[0]) == "torchrun":
        return True
    return len(argv) >= 3 and argv[1] == "-m" and argv[2] == "torch.distributed.run"


def torchrun_args(argv: Sequence[str]) -> list[str]:
    """torchrun's own arguments (after `torchrun` or `python -m torch.distributed.run`)."""
    return list(argv[1:] if os.path.basename(argv[0]) == "torchrun" else argv[3:])
