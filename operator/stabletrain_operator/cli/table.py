"""Plain-text tables the way kubectl prints them: left-aligned columns, two spaces apart."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(title) for title in header]
    for row in rows:
        for index, cell in enumerate(row):
            widths[index] = max(widths[index], len(cell))
    lines = [header, *rows]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def age(since: datetime | None, now: datetime) -> str:
    """kubectl's compact age: 45s, 12m, 3h, 5d."""
    if since is None:
        return "-"
    seconds = max(int((now - since) / timedelta(seconds=1)), 0)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def integer(value: int | None) -> str:
    return "-" if value is None else str(value)
