"""The chaos run as a person reads it (tables) and as a file keeps it (JSON)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from support.chaos.checks import CheckpointReport
from support.chaos.measure import LIVE_WINDOW_S, FaultResult, Incident, Summary
from support.chaos.run import Applied
from support.chaos.schedule import Planned

TARGET_ETTR = 0.95
TARGET_LOSS = 0.03
PHASES = ("detect_s", "stop_s", "relaunch_s", "start_s", "lost_s")
"""The parts of a recovery, in the order they happen."""


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def schedule_lines(plan: Sequence[Planned], seed: int) -> list[str]:
    """The plan, then how dense it really is: what a reader compares with the interval."""
    starts = [p.at for p in plan if p.follows is None]
    lines = [f"fault plan (seed {seed}):", *(f"  {p.describe()}" for p in plan)]
    if len(starts) > 1:
        span = starts[-1] - starts[0]
        lines.append(
            f"  {len(plan)} faults in {len(starts)} groups over {span:.0f} s: one group every "
            f"{span / (len(starts) - 1):.0f} s on average, one fault every "
            f"{span / (len(plan) - 1):.0f} s"
        )
    return lines


def applied_lines(applied: Sequence[Applied], started_at: float) -> list[str]:
    lines = ["faults injected (s after the chaos job's first step):"]
    for item in applied:
        if item.injected is None:
            lines.append(f"  #{item.planned.index} {item.planned.kind}: {item.error}")
            continue
        fired = ""
        if item.fired is not None:
            fired = (
                f"; struck at step {item.fired.get('step')} of attempt {item.fired.get('attempt')}"
            )
        lines.append(
            f"  #{item.planned.index} {item.planned.kind:<18} {item.injected.at - started_at:7.1f}"
            f"  {item.injected.target} [{item.phase}]{fired}"
        )
    return lines


def fault_table(results: Sequence[FaultResult]) -> list[str]:
    head = (f"  {'#':>2} {'kind':<18} {'at s':>6} {'phase':<11} {'expected':<17} {'action':<17}"
            f" {'ok':<3} {'detect':>6} {'stop':>5} {'relnch':>6} {'start':>5} {'1st step':>8}"
            f" {'lost':>4} {'lost s':>6} {'pause':>5}  note")  # fmt: skip
    lines = ["per fault (seconds; detect: struck -> Stopping, stop: -> Planning, relaunch: -> "
             "pods Running, start: -> first step, 1st step: injected -> first resumed step):",
             head]  # fmt: skip
    for r in results:
        lines.append(
            f"  {r.index:>2} {r.kind:<18} {_s(r.injected_at):>6} {r.phase:<11} "
            f"{r.expected or '(none)':<17} {r.action or '(none)':<17} "
            f"{'yes' if r.matched else 'NO':<3}"
            f" {_s(r.detect_s):>6} {_s(r.stop_s):>5} {_s(r.relaunch_s):>6} {_s(r.start_s):>5}"
            f" {_s(r.first_step_s):>8} {r.steps_lost if r.steps_lost is not None else '-':>4}"
            f" {_s(r.lost_s):>6} {_s(r.pause_s):>5}  {r.note}"
        )
    return lines


def unattributed_lines(decisions: Sequence[Incident], clock: float) -> list[str]:
    """The decisions no fault explains: shown, never counted against a fault."""
    if not decisions:
        return ["decisions attributed to no fault: none"]
    return [
        f"decisions attributed to no fault (no fault of a kind they answer before them, none "
        f"struck or ended within {LIVE_WINDOW_S:.0f} s before; s after the chaos job's first "
        f"step):",
        *(f"  {d.describe(clock)}" for d in decisions),
    ]


def breakdown(results: Sequence[FaultResult]) -> dict[str, dict[str, float | None]]:
    """Kind -> mean seconds of each part of its recoveries."""
    table: dict[str, dict[str, float | None]] = {}
    for kind in dict.fromkeys(r.kind for r in results):
        mine = [r for r in results if r.kind == kind]
        row: dict[str, float | None] = {}
        for part in (*PHASES, "pause_s"):
            values = [getattr(r, part) for r in mine if getattr(r, part) is not None]
            row[part] = statistics.fmean(values) if values else None
        table[kind] = row
    return table


def breakdown_lines(results: Sequence[FaultResult]) -> list[str]:
    lines = ["per kind, mean seconds (lost: steps lost at the clean run's pace):",
             f"  {'kind':<18} {'detect':>6} {'stop':>5} {'relnch':>6} {'start':>5} {'lost':>5}"
             f" {'total':>6} {'pause':>5}"]  # fmt: skip
    for kind, row in breakdown(results).items():
        known = [row[p] for p in PHASES if row[p] is not None]
        total = sum(v for v in known if v is not None) if known else None
        lines.append(
            f"  {kind:<18} {_s(row['detect_s']):>6} {_s(row['stop_s']):>5} "
            f"{_s(row['relaunch_s']):>6} {_s(row['start_s']):>5} {_s(row['lost_s']):>5} "
            f"{_s(total):>6} {_s(row['pause_s']):>5}"
        )
    restarts = [r for r in results if r.stop_s is not None and r.relaunch_s is not None]
    if restarts:
        means = {p: statistics.fmean(getattr(r, p) or 0.0 for r in restarts) for p in PHASES}
        every = sum(means.values())
        lines.append(
            f"  per recovery, mean of {len(restarts)}: {every:.1f} s, of which detection "
            f"{means['detect_s']:.1f} s, stop + relaunch "
            f"{means['stop_s'] + means['relaunch_s']:.1f} s, process start "
            f"{means['start_s']:.1f} s, steps lost {means['lost_s']:.1f} s"
        )
    return lines


def summary_lines(
    summary: Summary, results: Sequence[FaultResult], checkpoints: CheckpointReport,
    orphans: Sequence[str], under_load: str,
) -> list[str]:  # fmt: skip
    healed = all(r.matched for r in results)
    loss_gap = abs(summary.final_ratio - 1.0)
    return [
        f"clean run {summary.clean_seconds:.1f} s for {summary.final_step} steps "
        f"({summary.pace * 1000:.0f} ms/step); chaos run {summary.chaos_seconds:.1f} s",
        f"ETTR {summary.ettr:.1%} (target >= {TARGET_ETTR:.0%}) {under_load}",
        f"final loss, mean of the last 50 steps: clean {summary.clean_final:.4f}, chaos "
        f"{summary.chaos_final:.4f} ({summary.final_ratio - 1.0:+.2%}; target within "
        f"{TARGET_LOSS:.0%}: {'met' if loss_gap <= TARGET_LOSS else 'MISSED'}); step "
        f"{summary.final_step} alone: clean {summary.clean_last:.4f}, "
        f"chaos {summary.chaos_last:.4f}",
        f"faults healed with the action their kind expects: "
        f"{sum(r.matched for r in results)}/{len(results)} ({'all' if healed else 'NOT all'})",
        f"human actions needed: {summary.human_actions}",
        f"checkpoints: {len(checkpoints.loaded)} copies verified, loaded and finite; "
        f"{len(checkpoints.torn)} torn on purpose and rejected; problems: "
        f"{checkpoints.problems or 'none'}",
        f"left after deleting the job: {list(orphans) or 'nothing'}",
    ]


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=_plain))


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return str(value)
