"""When each fault of a chaos run strikes: a seeded plan, printed and saved before the run.

A fault is planned either at a moment (seconds after the job's first step) or as the
second half of a pair that overlaps: `after="recovering"` waits until the job is seen in a
recovery phase (Stopping, Planning, Relaunching) after the fault it follows, so it strikes
while that recovery is in progress (the operator SIGKILLed mid-rollback is such a pair);
`after="next"` strikes right behind the fault it follows (a torn checkpoint, then a crash
whose restart must not pick the torn copy). Pure logic: no cluster, no clock.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

ROLLBACK_KINDS = ("spike", "nan")
"""Numerical faults: the policy rolls back."""
RESTART_KINDS = ("kill", "hang", "lost-node")
"""Infrastructure faults: the policy restarts from the latest checkpoint."""
QUIET_KINDS = ("pfs-readonly", "operator-kill", "apiserver-restart", "corrupt-checkpoint")
"""Faults the run rides through: no restart is needed and training goes on."""
ALL_KINDS = (*ROLLBACK_KINDS, *RESTART_KINDS, *QUIET_KINDS)
REPEATABLE = (*RESTART_KINDS, *QUIET_KINDS)
"""What fills a long schedule past one of each kind. Numerical faults are not repeated: the
rollback budget (5) and the recurrence rule (a second onset within 1,000 steps is a harder
rollback, a third fails the job) make repeated spikes a test of the budget, not of healing."""
After = Literal["", "recovering", "next"]


@dataclass(frozen=True)
class Planned:
    """One fault of the plan."""

    index: int
    kind: str
    at: float
    """Seconds after the chaos job's first training step: when it strikes, or, for the
    second fault of a pair, the earliest it may."""
    follows: int | None = None
    """Index of the fault this one overlaps."""
    after: After = ""

    def describe(self) -> str:
        if self.follows is None:
            return f"#{self.index} {self.kind} at {self.at:.0f} s"
        how = "during the recovery of" if self.after == "recovering" else "right after"
        return f"#{self.index} {self.kind} {how} #{self.follows}"


def expected_action(kind: str) -> str:
    """The action the default policy must take for a fault of `kind` ("" for none)."""
    if kind in ROLLBACK_KINDS:
        return "Rollback"
    if kind in RESTART_KINDS:
        return "RestartFromLatest"
    if kind in QUIET_KINDS:
        return ""
    raise ValueError(f"unknown fault kind {kind!r}; known: {list(ALL_KINDS)}")


def make_schedule(
    seed: int,
    window: tuple[float, float],
    interval: float,
    kinds: Sequence[str] = ALL_KINDS,
) -> list[Planned]:
    """A seeded plan over `window` (first and last second a fault may start at) with one
    fault group about every `interval` seconds, gaps drawn uniformly in [0.5, 1.5] x
    interval and scaled down if the groups would not fit.

    Every kind of `kinds` strikes at least once. Two groups are pairs that overlap: a
    numerical fault with the operator SIGKILLed during its rollback, and a torn checkpoint
    followed at once by a crash (kill or lost node). The rest are single faults, and a long
    window is filled with more of REPEATABLE.
    """
    start, end = window
    if interval <= 0:
        raise ValueError(f"the mean interval between faults must be positive, got {interval}")
    if end <= start:
        raise ValueError(f"the fault window [{start}, {end}] s is empty")
    unknown = [k for k in kinds if k not in ALL_KINDS]
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {list(ALL_KINDS)}")
    rng = random.Random(seed)
    left = list(dict.fromkeys(kinds))
    groups: list[list[tuple[str, After]]] = []
    numerical = [k for k in ROLLBACK_KINDS if k in left]
    if numerical and "operator-kill" in left:
        first = rng.choice(numerical)
        groups.append([(first, ""), ("operator-kill", "recovering")])
        left.remove(first)
        left.remove("operator-kill")
    crashes = [k for k in ("kill", "lost-node") if k in kinds]
    if "corrupt-checkpoint" in left and crashes:
        crash = rng.choice(crashes)
        groups.append([("corrupt-checkpoint", ""), (crash, "next")])
        left.remove("corrupt-checkpoint")
        if crash in left:
            left.remove(crash)
    groups += [[(kind, "")] for kind in left]
    slots = max(len(groups), math.floor((end - start) / interval) + 1)
    fill = [k for k in REPEATABLE if k in kinds]
    while len(groups) < slots and fill:
        groups.append([(rng.choice(fill), "")])
    rng.shuffle(groups)
    gaps = [rng.uniform(0.5, 1.5) * interval for _ in groups[1:]]
    if sum(gaps) > end - start:
        scale = (end - start) / sum(gaps)
        gaps = [gap * scale for gap in gaps]
    plan: list[Planned] = []
    at = start
    for number, group in enumerate(groups):
        if number:
            at += gaps[number - 1]
        head = len(plan)
        for kind, after in group:
            follows = head if after else None
            plan.append(Planned(len(plan), kind, round(at, 1), follows, after))
    return plan


def explicit_schedule(entries: Sequence[tuple[str, float | str]]) -> list[Planned]:
    """A hand-written plan: (kind, seconds) strikes at that moment, (kind, "recovering")
    or (kind, "next") overlaps the entry before it."""
    plan: list[Planned] = []
    for kind, when in entries:
        expected_action(kind)
        if isinstance(when, str):
            if when not in ("recovering", "next") or not plan:
                raise ValueError(
                    f"{kind}: {when!r} must be 'recovering' or 'next' and follow another fault"
                )
            after: After = "recovering" if when == "recovering" else "next"
            plan.append(Planned(len(plan), kind, plan[-1].at, len(plan) - 1, after))
        else:
            plan.append(Planned(len(plan), kind, float(when)))
    return plan


def plan_json(plan: Sequence[Planned]) -> list[dict[str, Any]]:
    return [asdict(p) for p in plan]
