"""Faults asked for while the run goes: trigger files in a directory every rank can see.

The scripted faults of faults.py strike at a step fixed before the run starts. A chaos run
needs the opposite: a fault at a wall-clock moment the harness picks, exactly once in the
whole run, however many attempts replay the same steps. So the harness drops a trigger,
`<dir>/<id>.json` (`{"kind": "nan" | "hang" | "spike", "rank": r, ...}`), into a directory
on the PFS, and the rank it names acts on it before its next step:

- it claims the trigger by creating `<id>.fired`: a fully written temporary file
  hard-linked to that name, so the claim and its content appear together and only one
  process of any attempt can ever make it (a relaunched attempt finds the marker and does
  not fire again);
- a claim that cannot be written (the PFS read-only or away) is retried at the next step:
  a fault fires only once its marker exists.

A spike is bad data, not an accident: its marker names the shard that turned bad, and
every rank of this and every later attempt reads the markers and keeps that shard
poisoned, as a corrupt file stays corrupt. Watching costs one `stat` of the directory per
step; it is listed only when its modification time moved. Standard library only, so the
unit tests read it without torch.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KINDS = ("nan", "hang", "spike")
TRIGGER_SUFFIX = ".json"
MARKER_SUFFIX = ".fired"
DEFAULT_NAN_STEPS = 3
"""The default detection's nonFinite.consecutiveSteps: fewer NaN steps are only skipped."""


class TriggerError(ValueError):
    """A trigger file that does not say what to do."""


@dataclass(frozen=True)
class Trigger:
    """One fault asked for: its kind, the rank that acts, and the NaN burst's length."""

    trigger_id: str
    kind: str
    rank: int
    nan_steps: int = DEFAULT_NAN_STEPS


@dataclass(frozen=True)
class Fired:
    """What the rank that acted recorded: where and when the fault really struck."""

    trigger_id: str
    kind: str
    rank: int
    step: int
    attempt: int
    time: float
    shard: str | None = None
    """The shard a spike poisoned."""
    steps: int = 1
    """How many steps in a row the fault lasts (a NaN burst's length)."""


def parse_trigger(trigger_id: str, text: str) -> Trigger:
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as error:
        raise TriggerError(f"trigger {trigger_id}: not JSON ({error})") from None
    if not isinstance(raw, dict):
        raise TriggerError(f"trigger {trigger_id}: expected an object, got {type(raw).__name__}")
    kind, rank, steps = raw.get("kind"), raw.get("rank"), raw.get("steps", DEFAULT_NAN_STEPS)
    if kind not in KINDS:
        raise TriggerError(f"trigger {trigger_id}: kind {kind!r} is not one of {list(KINDS)}")
    if not isinstance(rank, int) or rank < 0:
        raise TriggerError(f"trigger {trigger_id}: rank must be an integer >= 0, got {rank!r}")
    if not isinstance(steps, int) or steps < 1:
        raise TriggerError(f"trigger {trigger_id}: steps must be an integer >= 1, got {steps!r}")
    return Trigger(trigger_id, kind, rank, steps)


def parse_marker(trigger_id: str, text: str) -> Fired:
    raw = json.loads(text)
    return Fired(
        trigger_id, str(raw["kind"]), int(raw["rank"]), int(raw["step"]), int(raw["attempt"]),
        float(raw["time"]), raw.get("shard"), int(raw.get("steps", 1)),
    )  # fmt: skip


def _claim(directory: Path, fired: Fired) -> bool:
    """Creates the marker with its content in one step; False if any process made it first."""
    body = json.dumps({key: value for key, value in vars(fired).items() if key != "trigger_id"})
    temp = directory / f".{fired.trigger_id}.{os.getpid()}.tmp"
    temp.write_text(body)
    try:
        os.link(temp, directory / f"{fired.trigger_id}{MARKER_SUFFIX}")
    except FileExistsError:
        return False
    finally:
        temp.unlink()
    return True


class TriggerBox:
    """One rank's view of the trigger directory: what it must do now, and the bad shards."""

    def __init__(
        self,
        directory: Path,
        rank: int,
        attempt: int,
        *,
        clock: Callable[[], float] = time.time,
        warn: Callable[[str], None] = print,
    ) -> None:
        self.directory = directory
        self.rank = rank
        self.attempt = attempt
        self._clock = clock
        self._warn = warn
        self._seen_mtime: int | None = None
        self._rescan = True
        self._pending: dict[str, Trigger] = {}
        self._fired: dict[str, Fired] = {}
        self._invalid: set[str] = set()
        self._unclaimed_warning = ""

    @property
    def fired(self) -> dict[str, Fired]:
        """Every marker found so far (any rank's, any attempt's), by trigger id."""
        return dict(self._fired)

    def poisoned_shards(self) -> frozenset[str]:
        """Shards a spike turned bad, in this attempt or an earlier one."""
        return frozenset(f.shard for f in self._fired.values() if f.shard is not None)

    def scan(self) -> None:
        """Reads the directory if it changed (one stat otherwise)."""
        self._refresh()

    def due(self, step: int, next_shard: Callable[[], str]) -> list[Fired]:
        """The faults this rank must strike with before `step`, each already claimed.

        `next_shard` names the shard the data reads next; it is asked only for a spike.
        """
        self._refresh()
        struck: list[Fired] = []
        for trigger in sorted(self._pending.values(), key=lambda t: t.trigger_id):
            shard = next_shard() if trigger.kind == "spike" else None
            fired = Fired(
                trigger.trigger_id, trigger.kind, self.rank, step, self.attempt, self._clock(),
                shard, trigger.nan_steps if trigger.kind == "nan" else 1,
            )  # fmt: skip
            try:
                claimed = _claim(self.directory, fired)
            except OSError as error:
                warning = f"tiny-gpt: trigger {trigger.trigger_id} not claimed yet: {error}"
                if warning != self._unclaimed_warning:  # once per outage, not every step
                    self._warn(warning)
                self._unclaimed_warning = warning
                self._rescan = True
                continue
            del self._pending[trigger.trigger_id]
            if claimed:
                self._fired[trigger.trigger_id] = fired
                struck.append(fired)
            else:
                self._rescan = True
        return struck

    def _refresh(self) -> None:
        try:
            mtime = self.directory.stat().st_mtime_ns
        except OSError:
            return
        if mtime == self._seen_mtime and not self._rescan:
            return
        self._seen_mtime, self._rescan = mtime, False
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            self._rescan = True
            return
        markers = {n[: -len(MARKER_SUFFIX)] for n in names if n.endswith(MARKER_SUFFIX)}
        for trigger_id in markers - set(self._fired):
            self._pending.pop(trigger_id, None)
            try:
                self._fired[trigger_id] = parse_marker(
                    trigger_id, (self.directory / f"{trigger_id}{MARKER_SUFFIX}").read_text()
                )
            except (OSError, ValueError, KeyError, TypeError) as error:
                self._warn(f"tiny-gpt: marker {trigger_id} unreadable: {error}")
                self._rescan = True
        for name in names:
            trigger_id = name[: -len(TRIGGER_SUFFIX)]
            if not name.endswith(TRIGGER_SUFFIX) or name.startswith("."):
                continue
            if trigger_id in markers or trigger_id in self._pending or trigger_id in self._invalid:
                continue
            try:
                trigger = parse_trigger(trigger_id, (self.directory / name).read_text())
            except OSError:
                self._rescan = True
                continue
            except TriggerError as error:
                self._warn(f"tiny-gpt: ignoring trigger: {error}")
                self._invalid.add(trigger_id)
                continue
            if trigger.rank == self.rank:
                self._pending[trigger_id] = trigger


def shard_read_next(
    position: int, shard_ids: Sequence[str], shard_samples: int, passed_over: Collection[str]
) -> str:
    """The first shard the data stream has not started at `position` (shards of
    `shard_samples` laid end to end, epoch after epoch), passing over `passed_over` (the
    skip-list's shards and those already poisoned): a shard no rank has read any of yet, so
    every rank learns it is bad before it reads the first sample, and it is bad whole."""
    count = len(shard_ids)
    if count == 0 or shard_samples <= 0:
        raise ValueError(f"no shards to choose from ({count} of {shard_samples} samples)")
    offset = position % (count * shard_samples)
    index = offset // shard_samples + (1 if offset % shard_samples else 0)
    for k in range(count):
        shard = shard_ids[(index + k) % count]
        if shard not in passed_over:
            return shard
    raise ValueError("every shard is skipped or poisoned already; none is left to poison")
