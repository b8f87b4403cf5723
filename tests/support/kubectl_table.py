"""`kubectl get`'s table read back by column position (an empty cell leaves no word, so
splitting on whitespace would shift every cell after it)."""

from __future__ import annotations

import re
import subprocess

from support.controlplane import ControlPlane


def kubectl_get(plane: ControlPlane, *args: str) -> str:
    return subprocess.run(
        plane.kubectl("get", *args), capture_output=True, text=True, check=True, timeout=30
    ).stdout


def rows(table: str) -> dict[str, dict[str, str]]:
    """Every row by its first cell (NAME): column header -> cell text."""
    header, *lines = table.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+( \S+)*", header)]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    found = {}
    for line in lines:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        found[cells[0]] = dict(zip(names, cells, strict=True))
    return found
