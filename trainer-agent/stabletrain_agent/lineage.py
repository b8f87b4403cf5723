"""Which data each recent step consumed, kept for forensics when a spike comes.

Practitioners who roll back by hand first ask "which batches were those?"; by then the
loader has moved on. The ring keeps the ids (batch index, shard, sample range: never the
contents) of the last steps in memory, bounded so a month-long run costs nothing, and
writes the window to the PFS when a spike starts or training trips. Each rank writes its
own file: ranks read different slices, and writing needs no collective.
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path
from typing import NamedTuple

from stabletrain_agent.data import BatchLineage

DEFAULT_WINDOW = 512
"""Steps kept: covers PaLM-style skip windows (200-500 batches) around an onset."""
SUSPECT_LEAD_STEPS = 2
"""Steps before the onset whose data is suspect too: a bad batch can take a step or two
to show in the loss (its gradient lands in the weights, the next batch pays for it)."""


class StepLineage(NamedTuple):
    """One step's batch (a tuple: one is recorded per step)."""

    step: int
    batch: BatchLineage


class LineageRing:
    """The last ``window`` steps' lineage of this rank, oldest first."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window <= 0:
            raise ValueError(f"lineage window must be positive, got {window}")
        self._steps: deque[StepLineage] = deque(maxlen=window)

    def record(self, step: int, batch: BatchLineage) -> None:
        self._steps.append(StepLineage(step, batch))

    def window(self) -> list[StepLineage]:
        return list(self._steps)


def suspect_shards(steps: list[StepLineage], onset_step: int) -> list[tuple[int, str]]:
    """Shards read from shortly before the onset on, as ``(steps from the onset, shard)``.

    Closest to the onset first; each shard once, at its closest step.
    """
    closest: dict[str, int] = {}
    for entry in steps:
        if entry.step < onset_step - SUSPECT_LEAD_STEPS:
            continue
        distance = abs(entry.step - onset_step)
        for sample_range in entry.batch.ranges:
            known = closest.get(sample_range.shard_id)
            if known is None or distance < known:
                closest[sample_range.shard_id] = distance
    return sorted((distance, shard) for shard, distance in closest.items())


def lineage_dir(root: Path, attempt: int, onset_step: int) -> Path:
    """Where the window around ``onset_step`` goes; the trip report points here."""
    return root / f"attempt-{attempt}" / f"onset-{onset_step}"


def write_window(directory: Path, rank: int, onset_step: int, steps: list[StepLineage]) -> Path:
    """Write this rank's window as JSON atomically (temp file, fsync, rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {
        "rank": rank,
        "onsetStep": onset_step,
        "steps": [
            {
                "step": entry.step,
                "batchIndex": entry.batch.batch_index,
                "ranges": [
                    {"shardId": r.shard_id, "start": r.start, "stop": r.stop}
                    for r in entry.batch.ranges
                ],
            }
            for entry in steps
        ],
    }
    target = directory / f"rank-{rank}.json"
    temp = directory / f".rank-{rank}.json.tmp"
    with temp.open("w", encoding="utf-8") as handle:
        json.dump(payload, handle, separators=(",", ":"))
        handle.flush()
        os.fsync(handle.fileno())
    temp.replace(target)
    return target
