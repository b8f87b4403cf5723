"""Where this process's directives come from: the attempt's file, then live updates.

The operator writes the attempt's initial Directives into a file before it creates the
pods, so they are there at start; later decisions (ReduceLR, new thresholds) arrive over
HTTP and land here through ``offer``. The guard polls ``latest`` once per step: it must
never block the training loop, so reads take no lock and writes swap one reference.

A missing or broken directives file that the environment names is an error, never a silent
fall-back to defaults: a run that ignores its rollback LR or skip list would re-spike.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stabletrain_contract import env
from stabletrain_contract.base import ContractError
from stabletrain_contract.channel import LiveOutcome, judge_live_directive
from stabletrain_contract.directives import (
    GENERATION_ADVANCE_MAX,
    Directives,
    parse_directives,
)


class DirectivesError(RuntimeError):
    """The directives this process was started with cannot be used; the message says why."""


@dataclass(frozen=True)
class OfferResult:
    """What happened to one live directive, for the HTTP answer and the log."""

    outcome: LiveOutcome
    applied_generation: int
    """Generation in force after the offer (0: still running without directives)."""
    message: str


class DirectiveSource:
    """The newest Directives this process knows, for the given attempt."""

    def __init__(self, attempt: int, initial: Directives | None = None) -> None:
        if attempt < 0:
            raise DirectivesError(f"attempt must not be negative, got {attempt}")
        if initial is not None and initial.attempt != attempt:
            raise DirectivesError(
                f"initial directives are for attempt {initial.attempt} but this pod runs "
                f"attempt {attempt}: refusing another attempt's plan"
            )
        self._attempt = attempt
        self._current = initial
        self._write_lock = threading.Lock()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DirectiveSource:
        """The pod's attempt and initial directives, as the operator's env describes them.

        Without ``STABLETRAIN_DIRECTIVES_PATH`` the default path is used if it exists;
        with neither, the run is standalone (a plain loop outside the operator) and
        ``latest`` stays None until a live directive arrives.
        """
        environ = os.environ if environ is None else environ
        attempt = _attempt_from(environ)
        named = environ.get(env.DIRECTIVES_PATH)
        if named is not None:
            return cls(attempt, read_directives_file(Path(named)))
        default = Path(str(env.DEFAULT_DIRECTIVES_PATH))
        if default.exists():
            return cls(attempt, read_directives_file(default))
        return cls(attempt)

    @property
    def attempt(self) -> int:
        return self._attempt

    def latest(self) -> Directives | None:
        """The newest accepted directives, or None when running standalone. Never blocks."""
        return self._current

    @property
    def applied_generation(self) -> int:
        current = self._current
        return 0 if current is None else current.generation

    def offer(self, incoming: Directives) -> OfferResult:
        """Accept a live directive if it is newer and for this attempt; idempotent by generation."""
        with self._write_lock:
            current = self._current
            outcome = self._judge(current, incoming)
            if outcome is LiveOutcome.APPLIED:
                self._current = incoming
            applied = self.applied_generation
        return OfferResult(outcome, applied, _explain(outcome, incoming, current, self._attempt))

    def _judge(self, current: Directives | None, incoming: Directives) -> LiveOutcome:
        if current is not None:
            return judge_live_directive(current, incoming)
        if incoming.attempt != self._attempt:
            return LiveOutcome.WRONG_ATTEMPT
        if incoming.generation > GENERATION_ADVANCE_MAX:
            return LiveOutcome.GENERATION_TOO_FAR
        if incoming.resume_step is not None:
            return LiveOutcome.RESUME_STEP_CHANGED
        return LiveOutcome.APPLIED


def read_directives_file(path: Path) -> Directives:
    """Directives from ``path``; DirectivesError names the path and every bad field."""
    try:
        payload = path.read_bytes()
    except OSError as error:
        raise DirectivesError(f"cannot read directives file {path}: {error.strerror}") from None
    try:
        return parse_directives(payload)
    except ContractError as error:
        raise DirectivesError(f"directives file {path}: {error}") from None


def _attempt_from(environ: Mapping[str, str]) -> int:
    raw = environ.get(env.ATTEMPT, "0")
    try:
        attempt = int(raw)
    except ValueError:
        raise DirectivesError(
            f"{env.ATTEMPT} must be a non-negative integer, got {raw!r}"
        ) from None
    if attempt < 0:
        raise DirectivesError(f"{env.ATTEMPT} must be a non-negative integer, got {raw!r}")
    return attempt


def _explain(
    outcome: LiveOutcome, incoming: Directives, current: Directives | None, attempt: int
) -> str:
    held = 0 if current is None else current.generation
    if outcome is LiveOutcome.APPLIED:
        return f"generation {incoming.generation} accepted (was {held})"
    if outcome is LiveOutcome.ALREADY_APPLIED:
        return (
            f"generation {incoming.generation} is not newer than the applied generation "
            f"{held}; nothing changed"
        )
    if outcome is LiveOutcome.WRONG_ATTEMPT:
        return f"directives are for attempt {incoming.attempt}, this pod runs attempt {attempt}"
    if outcome is LiveOutcome.GENERATION_TOO_FAR:
        return (
            f"generation {incoming.generation} is more than {GENERATION_ADVANCE_MAX} ahead of "
            f"the applied generation {held}; refused"
        )
    held_resume = None if current is None else current.resume_step
    return (
        f"resume_step {incoming.resume_step} differs from this attempt's {held_resume}; "
        "changing it needs a relaunch"
    )
