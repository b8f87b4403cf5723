"""The Preflight condition, from facts the running pods report or the preflight pod left.

Pure functions over the status, so the state machine calls them and unit tests drive them
directly. The condition is True while no severe finding stands and False otherwise; its
message has one line per finding. An Event goes out only when what the condition says
changes, not on every scrape that repeats the same facts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.preflight import PreflightFacts
from stabletrain_operator.api.constants import ConditionType, Reason
from stabletrain_operator.api.spec import PreflightMode, StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.conditions.entries import condition, set_condition
from stabletrain_operator.preflight.checklist import Finding, Severity, evaluate

STANDING_REFUSALS = frozenset({Reason.PREFLIGHT_REFUSED.value, Reason.PREFLIGHT_POD_FAILED.value})
"""Reasons that keep a Refuse-mode job from starting until its spec changes."""


@dataclass(frozen=True)
class Notice:
    """An Event to post after the status write."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class Outcome:
    status: StableTrainingJobStatus
    notices: tuple[Notice, ...] = ()


def verdict(
    findings: Sequence[Finding], mode: PreflightMode, *, refusing: bool
) -> tuple[bool, Reason, str]:
    """(condition status, reason, message) for a set of findings."""
    severe = [f for f in findings if f.severity is Severity.SEVERE]
    if not findings:
        return True, Reason.PREFLIGHT_PASSED, "no finding: every preflight check passed"
    lines = "\n".join(f.line() for f in findings)
    if not severe:
        return True, Reason.PREFLIGHT_WARNINGS, lines
    if refusing and mode is PreflightMode.REFUSE:
        return False, Reason.PREFLIGHT_REFUSED, lines
    return False, Reason.PREFLIGHT_SEVERE, lines


def _set(
    status: StableTrainingJobStatus,
    ok: bool,
    reason: Reason,
    message: str,
    *,
    now: datetime,
    generation: int | None,
) -> Outcome:
    previous = condition(status.conditions, ConditionType.PREFLIGHT)
    conditions = set_condition(
        status.conditions,
        ConditionType.PREFLIGHT,
        ok,
        reason,
        message,
        now=now,
        generation=generation,
    )
    updated = status.model_copy(update={"conditions": conditions})
    unchanged = (
        previous is not None
        and previous.reason == reason.value
        and previous.message == message[:32_768]
    )
    if unchanged:
        return Outcome(updated)
    kind = "Normal" if ok else "Warning"
    headline = message.replace("\n", " | ")
    return Outcome(updated, (Notice(kind, reason.value, f"preflight: {headline}"[:1024]),))


def judge(
    status: StableTrainingJobStatus,
    spec: StableTrainingJobSpec,
    facts: PreflightFacts,
    *,
    refusing: bool,
    now: datetime,
    generation: int | None,
) -> Outcome:
    """The condition for `facts`; `refusing` when a severe finding keeps the job from starting."""
    ok, reason, message = verdict(evaluate(facts, spec), spec.preflight.mode, refusing=refusing)
    return _set(status, ok, reason, message, now=now, generation=generation)


def reported_facts(agents: Sequence[AgentStatus], attempt: int) -> PreflightFacts | None:
    """Node rank 0's facts among this tick's scrapes of the current attempt."""
    reporting = sorted(
        (a for a in agents if a.attempt == attempt and a.preflight is not None),
        key=lambda a: a.node_rank,
    )
    return reporting[0].preflight if reporting else None


def from_running_pods(
    status: StableTrainingJobStatus,
    spec: StableTrainingJobSpec,
    agents: Sequence[AgentStatus],
    *,
    now: datetime,
    generation: int | None,
) -> Outcome:
    """Warn mode, and every job once it runs: the condition from the agents' own report."""
    facts = reported_facts(agents, status.attempt)
    if facts is None:
        return Outcome(status)
    return judge(status, spec, facts, refusing=False, now=now, generation=generation)


class PodOutcome(StrEnum):
    PENDING = "Pending"
    """Not created yet, or not finished."""
    FACTS = "Facts"
    FAILED = "Failed"


@dataclass(frozen=True)
class PreflightPodResult:
    """The preflight pod as the reconcile read it."""

    name: str
    outcome: PodOutcome
    facts: PreflightFacts | None = None
    detail: str = ""
    """Why it failed: the container's reason, exit code and message."""


@dataclass(frozen=True)
class Gate:
    """Refuse mode before the first worker pod: start them or not."""

    proceed: bool
    outcome: Outcome


def gate(
    status: StableTrainingJobStatus,
    spec: StableTrainingJobSpec,
    pod: PreflightPodResult | None,
    *,
    now: datetime,
    generation: int | None,
) -> Gate:
    """Workers start only from facts without a severe finding; anything else waits.

    A refusal stands for the spec generation it was made for: a changed spec (a fixed
    script, more space, mode Warn) gets a new preflight pod.
    """
    current = condition(status.conditions, ConditionType.PREFLIGHT)
    standing = (
        current is not None
        and current.observed_generation == generation
        and current.reason in STANDING_REFUSALS
    )
    if standing:
        return Gate(False, Outcome(status))
    if pod is None or pod.outcome is PodOutcome.PENDING:
        name = pod.name if pod is not None else "the preflight pod"
        message = f"{name} is gathering the run's facts; worker pods start after the checks"
        return Gate(
            False,
            _set(status, False, Reason.PREFLIGHT_RUNNING, message, now=now, generation=generation),
        )
    if pod.outcome is PodOutcome.FAILED or pod.facts is None:
        message = (
            f"preflight pod {pod.name} ended without facts ({pod.detail}); no worker pod is "
            "started without them: the script must create its Guard with Guard.from_env"
        )
        outcome = _set(
            status, False, Reason.PREFLIGHT_POD_FAILED, message, now=now, generation=generation
        )
        return Gate(False, outcome)
    outcome = judge(status, spec, pod.facts, refusing=True, now=now, generation=generation)
    preflight = condition(outcome.status.conditions, ConditionType.PREFLIGHT)
    return Gate(preflight is not None and preflight.status == "True", outcome)
