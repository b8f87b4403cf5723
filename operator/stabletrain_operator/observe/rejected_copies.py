"""Checkpoint copies the pods refused, each named once in a Warning Event.

A copy that does not verify against the job's key was not written by this job (or was
changed since): another tenant with write access to the tier, or damage. The pods never
load it and a restore moves it aside; the job's owner must still hear of it, since someone
wrote into the job's storage. Each pod reports what it refused (AgentStatus.rejected);
the daemon announces each (copy, where it went) once while it runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from stabletrain_contract.channel import RejectedCopy
from stabletrain_operator.observe.scrape import ScrapeResult

ANNOUNCED_MAX = 1024
"""Copies remembered as announced; beyond that the oldest may be announced again."""


def announce(announced: dict[tuple[str, str], None], scrapes: Iterable[ScrapeResult]) -> list[str]:
    """Messages for the copies the scrapes report that were not announced yet (recorded in
    `announced`, an insertion-ordered set)."""
    messages = []
    for result in scrapes:
        for copy in () if result.status is None else result.status.rejected:
            key = (copy.path, copy.quarantined_as or "")
            if key in announced:
                continue
            announced[key] = None
            messages.append(describe(result.pod, copy))
    for stale in list(announced)[: max(0, len(announced) - ANNOUNCED_MAX)]:
        del announced[stale]
    return messages


def describe(pod: str, copy: RejectedCopy) -> str:
    moved = f"; moved aside as {copy.quarantined_as}" if copy.quarantined_as else ""
    return f"pod {pod} refused checkpoint copy {copy.path}: {copy.problem}{moved}"
