"""What a chaos run cost, fault by fault, measured against the clean run of the same steps.

Everything comes from what the run left behind: the job's final status (rollbackHistory:
each incident's action, signal and steps), the phases a Recorder saw with this host's clock
(Stopping -> Planning -> Relaunching), the pods it saw Running, and the ranks' own step logs
(the same clock). Each incident that stopped the pods is laid at the door of one fault: the
latest fault not yet explained, struck before the operator stopped the pods, whose kind
expects that action, or else the latest that struck or ended within LIVE_WINDOW_S before it
(a restarting kind first), so a wrong action shows as a mismatch, not a gap. A rollback that
skips the shard a spike fault poisoned belongs to that fault, however late: the shard stays
bad, and a later pass over the data reads it again. A stop that fits no earlier fault and
follows none that closely is reported apart, like the live decisions below.

A live decision (Alert, ReduceLR: nothing stops) is a detector's answer to what the last
steps looked like, so it belongs to a fault only if it came within LIVE_WINDOW_S of that
fault striking or ending; the quiet kinds accept an Alert as their action (no restart is
what they need). A live decision with no fault in its window is reported apart, as
attributed to no fault: it fails no fault, and a person reads it.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from support.chaos.run import RECOVERY_PHASES, Applied, RunResult
from support.chaos.schedule import QUIET_KINDS, expected_action
from support.timeline import Recorder
from support.tinygpt import StepLogs, finite

Json = dict[str, Any]
RELAUNCHING_ACTIONS = ("Rollback", "RestartFromLatest")
LIVE_ACTIONS = ("Alert", "ReduceLR")
"""Decisions the pods carry out while they train: nothing is stopped or relaunched."""
LIVE_WINDOW_S = 60.0
"""How long after a fault struck (or, for a timed one, ended) a live decision may be its
answer. The detectors judge the last few dozen steps (ThroughputDrop: 20 steps of grace,
then 10 slow ones in a row), a few seconds at the chaos run's pace, plus a scrape: a
minute is generous, and a decision later than that answers something else."""
QUIET_WINDOW_S = 60.0
"""How long after a fault the run rides through its step gaps are looked at."""
FINAL_STEPS = 50
"""The final loss is the mean over this many last steps (one batch's loss is noisy)."""


@dataclass
class Incident:
    """One automatic action that stopped the pods, with its timeline (None: not seen)."""

    entry: Json
    """The rollbackHistory record."""
    stopping_at: float | None
    planning_at: float | None
    relaunching_at: float | None
    pods_running_at: float | None
    first_step_at: float | None
    reached_step: int | None
    """The last step the stopped attempt logged."""
    restored_step: int | None
    restores: dict[int, Json] = field(default_factory=dict)
    """Rank -> the relaunched attempt's start record (restored_step, restored_from)."""
    decided_at: float | None = None
    """When the operator decided (the record's time): what places an action that stopped
    nothing (Alert, ReduceLR, Fail)."""

    @property
    def action(self) -> str:
        return str(self.entry.get("action", ""))

    @property
    def live(self) -> bool:
        return self.action in LIVE_ACTIONS

    @property
    def at(self) -> float:
        """When the operator acted: the Stopping it was seen entering, else its record's time."""
        if self.stopping_at is not None:
            return self.stopping_at
        return self.decided_at if self.decided_at is not None else math.inf

    def describe(self, clock: float) -> str:
        """One line: the action, its signal, its step and when (seconds on `clock`)."""
        when = "-" if math.isinf(self.at) else f"{self.at - clock:.1f}"
        return (
            f"{self.action} on {self.entry.get('signal')} at step {self.entry.get('fromStep')}"
            f" ({when} s)"
        )

    @property
    def steps_lost(self) -> int | None:
        if self.reached_step is None or self.restored_step is None:
            return None
        return max(0, self.reached_step - self.restored_step)


def _phase_after(phases: list[tuple[float, str, Json]], name: str, after: float) -> float | None:
    return next((at for at, phase, _ in phases if phase == name and at >= after), None)


def incidents(recorder: Recorder, status: Json, logs: StepLogs, nodes: int) -> list[Incident]:
    phases = recorder.phases()
    history = status.get("rollbackHistory") or []
    relaunched = {int(e["attempt"]) for e in history if e.get("action") in RELAUNCHING_ACTIONS}
    found: list[Incident] = []
    for entry in history:
        if entry.get("action") not in RELAUNCHING_ACTIONS:
            decided = _entry_time(entry)
            found.append(Incident(entry, None, None, None, None, None, None, None, {}, decided))
            continue
        launched = int(entry["attempt"])
        stopped = _stopped_attempt(launched, relaunched)
        stopping = next(
            (at for at, phase, state in phases
             if phase == "Stopping" and int(state.get("attempt", -1)) == stopped),
            None,
        )  # fmt: skip
        if stopping is None:  # not seen (the API server was down)
            stopping = _entry_time(entry)
        base = stopping if stopping is not None else 0.0
        steps = logs.steps(launched)
        reached = [r["step"] for rank in range(nodes) for r in logs.steps(stopped, rank)]
        if not reached:  # stopped before its first step: it trained nothing to lose
            began = next((e for e in logs.events(stopped) if e["event"] == "start"), {})
            reached = [int(began.get("restored_step") or 0)]
        starts = {
            rank: next((e for e in logs.events(launched, rank) if e["event"] == "start"), {})
            for rank in range(nodes)
        }
        restored = starts[0].get("restored_step")
        if restored is None:  # nothing restored: a start from scratch
            restored = entry.get("toStep") or 0
        found.append(
            Incident(
                entry,
                stopping,
                _phase_after(phases, "Planning", base),
                _phase_after(phases, "Relaunching", base),
                recorder.pods_running(launched, nodes),
                float(steps[0]["time"]) if steps else None,
                max(reached) if reached else None,
                int(restored) if restored is not None else None,
                starts,
            )
        )
    return found


def _stopped_attempt(launched: int, relaunched: set[int]) -> int:
    """The attempt whose stop began the incident that launched `launched`. Usually the one
    before it; but a relaunch that could not restore its target is planned again without
    it, under the same record (the operator keeps one rollbackHistory entry per incident),
    so attempts with no record of their own belong to the incident before them."""
    stopped = launched - 1
    while stopped > 0 and stopped not in relaunched:
        stopped -= 1
    return stopped


def _entry_time(entry: Json) -> float | None:
    if not entry.get("time"):
        return None
    return datetime.fromisoformat(str(entry["time"]).replace("Z", "+00:00")).timestamp()


def struck_at(applied: Applied, logs: StepLogs, incident: Incident | None = None) -> float:
    """When the fault really took effect: a trigger when the rank acted on it, a spike at
    the first anomalous step the data produced, anything else when it was injected."""
    assert applied.injected is not None
    at = applied.injected.at
    if applied.fired is not None:
        at = float(applied.fired.get("time", at))
    onset = incident.entry.get("onsetStep") if incident is not None else None
    if applied.planned.kind == "spike" and onset is not None:
        attempt = int(incident.entry["attempt"]) - 1 if incident is not None else 0
        times = {r["step"]: r["time"] for r in logs.steps(attempt)}
        at = float(times.get(onset, at))
    return at


@dataclass
class FaultResult:
    """One fault: what it was, what the operator did about it, and what that cost."""

    index: int
    kind: str
    target: str
    injected_at: float | None
    """Seconds after the chaos job's first step (the plan's clock)."""
    phase: str
    expected: str
    action: str
    """The action of the incident laid at its door ("" for none)."""
    matched: bool
    note: str
    detect_s: float | None = None
    stop_s: float | None = None
    relaunch_s: float | None = None
    start_s: float | None = None
    first_step_s: float | None = None
    """Injection -> the relaunched attempt's first step."""
    steps_lost: int | None = None
    lost_s: float | None = None
    """Steps lost at the clean run's pace."""
    pause_s: float | None = None
    """A fault ridden through: the longest step gap within 60 s after it, minus the pace."""


def _gap_after(logs: StepLogs, at: float, pace: float, until: float) -> float | None:
    """The longest pause between steps from `at` for QUIET_WINDOW_S, or until the next
    fault: a pause a later fault causes is that fault's, not counted twice."""
    end = min(at + QUIET_WINDOW_S, until)
    times = sorted(float(r["time"]) for r in logs.curve() if at <= r["time"] <= end)
    before = [float(r["time"]) for r in logs.curve() if r["time"] < at]
    if before:
        times.insert(0, max(before))
    if len(times) < 2:
        return None
    return max(0.0, max(b - a for a, b in itertools.pairwise(times)) - pace)


_CORRUPT = re.compile(r"^(local|pfs) copy of step (\d+)")


def corrupted_copy(applied: Applied) -> tuple[str, int, str] | None:
    """(tier, step, node part) of a torn checkpoint, read from what the injector said."""
    injected = applied.injected
    if injected is None or injected.kind != "corrupt-checkpoint":
        return None
    found = _CORRUPT.match(injected.detail)
    if found is None:
        return None
    # local: <root>/node-<part>/step-N/attempt-A/<file>
    # PFS:   <root>/step-N/attempt-A/node-<part>/<file>
    parts = Path(injected.target).parts
    part = parts[-4] if found.group(1) == "local" else parts[-2]
    if len(parts) < 4 or not part.startswith("node-"):
        return None
    return found.group(1), int(found.group(2)), part.removeprefix("node-")


def picked_corrupt(copy: tuple[str, int, str], incident: Incident) -> bool:
    """Whether the relaunch restored the torn copy (a rank of that node part restored
    that step from that tier)."""
    tier, step, part = copy
    return any(
        str(rank) == part and start.get("restored_step") == step
        and start.get("restored_from") == tier
        for rank, start in incident.restores.items()
    )  # fmt: skip


def accepts(kind: str, action: str) -> bool:
    """Whether `action` is the right answer to a fault of `kind`: the one its kind expects,
    or an Alert for a quiet kind (it restarted nothing, which is all a quiet fault needs)."""
    return action == expected_action(kind) or (kind in QUIET_KINDS and action == "Alert")


@dataclass
class Attribution:
    owner: dict[int, Incident] = field(default_factory=dict)
    """Fault index -> the incident laid at its door."""
    also: dict[int, list[Incident]] = field(default_factory=dict)
    """Fault index -> live decisions in its window after it already had its answer, and the
    rollbacks of a spike's poisoned shard read again."""
    unattributed: list[Incident] = field(default_factory=list)
    """Decisions no fault explains: live ones within LIVE_WINDOW_S of none, and stops that
    fit no earlier fault's kind nor follow one within LIVE_WINDOW_S: shown on a line of their
    own, never laid at an unrelated fault."""

    def lay(self, index: int, incident: Incident) -> None:
        """The fault's answer if it has none yet, else one more decision it caused."""
        if index in self.owner:
            self.also.setdefault(index, []).append(incident)
        else:
            self.owner[index] = incident


def ended_at(applied: Applied, logs: StepLogs, incident: Incident | None = None) -> float:
    """When the fault was over: a timed one's end, any other when it struck."""
    assert applied.injected is not None
    at = struck_at(applied, logs, incident)
    until = applied.injected.until
    return max(at, until) if until is not None else at


def attribute(applied: Sequence[Applied], run: RunResult, found: list[Incident]) -> Attribution:
    """Which fault each incident answers (see the module docstring)."""
    struck = [a for a in applied if a.injected is not None]
    result = Attribution()
    for incident in sorted((i for i in found if not i.live), key=lambda i: i.at):
        poisoner = _poisoner(struck, incident, run)
        if poisoner is not None:  # its bad shard read again (a later pass over the data)
            result.lay(poisoner.planned.index, incident)
            continue
        before = [
            a for a in struck
            if a.planned.index not in result.owner
            and struck_at(a, run.logs, incident) <= incident.at
        ]  # fmt: skip
        fits = [a for a in before if expected_action(a.planned.kind) == incident.action]
        recent = [a for a in before if incident.at <= ended_at(a, run.logs) + LIVE_WINDOW_S]
        restarting = [a for a in recent if expected_action(a.planned.kind)]
        pool = fits or restarting or recent
        if not pool:
            result.unattributed.append(incident)  # a stop of the run's own making
            continue
        chosen = max(pool, key=lambda a: struck_at(a, run.logs, incident))
        result.owner[chosen.planned.index] = incident
    for incident in sorted((i for i in found if i.live), key=lambda i: i.at):
        near = [
            a for a in struck
            if struck_at(a, run.logs) <= incident.at <= ended_at(a, run.logs) + LIVE_WINDOW_S
        ]  # fmt: skip
        if not near:
            result.unattributed.append(incident)
            continue
        free = [a for a in near if a.planned.index not in result.owner]
        fits = [a for a in free if accepts(a.planned.kind, incident.action)]
        chosen = max(fits or free or near, key=lambda a: struck_at(a, run.logs))
        result.lay(chosen.planned.index, incident)
    return result


def _poisoner(struck: Sequence[Applied], incident: Incident, run: RunResult) -> Applied | None:
    """The spike fault whose poisoned shard this stop's rollback skips, if any."""
    skipped = {
        shard for skip in incident.entry.get("skipped") or [] for shard in skip.get("shardIds", [])
    }
    for applied in struck:
        shard = (applied.fired or {}).get("shard")
        if shard in skipped and struck_at(applied, run.logs, incident) <= incident.at:
            return applied
    return None


def measure_faults(
    applied: Sequence[Applied], run: RunResult, found: list[Incident], pace: float
) -> list[FaultResult]:
    """One result per planned fault, in plan order."""
    laid = attribute(applied, run, found)
    results = []
    starts = sorted(a.injected.at for a in applied if a.injected is not None)
    for item in applied:
        index = item.planned.index
        at = item.injected.at if item.injected is not None else math.inf
        until = next((t for t in starts if t > at), math.inf)
        result = _result(item, laid.owner.get(index), run, found, pace, until=until)
        for other in laid.also.get(index, []):
            result.note += f"; also {other.describe(run.first_step_at or run.created_at)}"
        results.append(result)
    return results


def unattributed(
    applied: Sequence[Applied], run: RunResult, found: list[Incident]
) -> list[Incident]:
    """The decisions no fault explains (see Attribution.unattributed)."""
    return attribute(applied, run, found).unattributed


def _result(
    item: Applied,
    incident: Incident | None,
    run: RunResult,
    found: list[Incident],
    pace: float,
    *,
    until: float,
) -> FaultResult:
    kind = item.planned.kind
    expected = expected_action(kind)
    if item.injected is None:
        return FaultResult(item.planned.index, kind, "", None, "", expected, "", False,
                           item.error)  # fmt: skip
    injected = item.injected
    clock = run.first_step_at or run.created_at
    result = FaultResult(
        item.planned.index, kind, injected.target, injected.at - clock, item.phase,
        expected, incident.action if incident else "", False, "",
    )  # fmt: skip
    if incident is None:
        result.matched = not expected or item.phase in RECOVERY_PHASES
        result.note = (
            "ridden through, no restart" if not expected
            else "absorbed by the recovery in progress" if result.matched
            else "no incident followed"
        )  # fmt: skip
        if not expected and item.phase not in RECOVERY_PHASES:
            result.pause_s = _gap_after(run.logs, injected.at, pace, until)
    elif incident.live:
        result.matched = accepts(kind, incident.action)
        at = struck_at(item, run.logs, incident)
        result.detect_s = _minus(incident.decided_at, at)
        result.note = (
            f"{incident.entry.get('signal')} at step {incident.entry.get('fromStep')}, "
            f"live (nothing stopped)"
        )
    else:
        result.matched = incident.action == expected
        at = struck_at(item, run.logs, incident)
        result.detect_s = _minus(incident.stopping_at, at)
        result.stop_s = _minus(incident.planning_at, incident.stopping_at)
        result.relaunch_s = _minus(incident.pods_running_at, incident.planning_at)
        result.start_s = _minus(incident.first_step_at, incident.pods_running_at)
        result.first_step_s = _minus(incident.first_step_at, injected.at)
        result.steps_lost = incident.steps_lost
        result.lost_s = None if incident.steps_lost is None else incident.steps_lost * pace
        result.note = (
            f"{incident.entry.get('signal')}: step {incident.reached_step} -> "
            f"{incident.restored_step}"
        )
    torn = corrupted_copy(item)
    if torn is not None:
        later = [i for i in found if i.at > injected.at and i.action in RELAUNCHING_ACTIONS]
        if not later:
            result.note += "; no recovery followed, the torn copy was never offered"
        elif picked_corrupt(torn, later[0]):
            result.matched = False
            result.note += f"; the next recovery restored the torn {torn[0]} copy of step {torn[1]}"
        else:
            result.note += (
                f"; the next recovery did not use the torn {torn[0]} copy of step {torn[1]}"
            )
    if kind == "operator-kill" and item.phase in RECOVERY_PHASES:
        result.note += f"; killed mid-recovery ({item.phase})"
    return result


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def final_curve(logs: StepLogs) -> dict[int, float]:
    """Step -> loss, the latest attempt's value where attempts replayed a step."""
    curve: dict[int, float] = {}
    for record in logs.curve():
        if finite(record["loss"]):
            curve[int(record["step"])] = float(record["loss"])
    return curve


@dataclass(frozen=True)
class Summary:
    clean_seconds: float
    chaos_seconds: float
    ettr: float
    final_step: int
    clean_final: float
    chaos_final: float
    """Mean loss over the last FINAL_STEPS steps."""
    clean_last: float
    chaos_last: float
    """The loss of the final step itself."""
    human_actions: int
    pace: float
    """Seconds per step of the clean run."""

    @property
    def final_ratio(self) -> float:
        return self.chaos_final / self.clean_final


def summarize(clean: RunResult, chaos: RunResult, steps: int, phases: Sequence[str]) -> Summary:
    """ETTR and the final losses. Human actions: the job failed, or was seen Suspended
    (both wait for a person); the harness itself never touches the job."""
    clean_s, chaos_s = clean.seconds, chaos.seconds
    if clean_s is None:
        raise RuntimeError("the clean run logged no step")
    pace = clean_s / steps
    a, b = final_curve(clean.logs), final_curve(chaos.logs)
    window = range(steps - FINAL_STEPS + 1, steps + 1)

    def mean(curve: dict[int, float]) -> float:
        values = [curve[s] for s in window if s in curve]
        return statistics.fmean(values) if values else math.nan

    human = int(chaos.status.get("phase") != "Succeeded") + sum(p == "Suspended" for p in phases)
    return Summary(
        clean_seconds=clean_s,
        chaos_seconds=chaos_s if chaos_s is not None else math.inf,
        ettr=clean_s / chaos_s if chaos_s else 0.0,
        final_step=steps,
        clean_final=mean(a),
        chaos_final=mean(b),
        clean_last=a.get(steps, math.nan),
        chaos_last=b.get(steps, math.nan),
        human_actions=human,
        pace=pace,
    )
