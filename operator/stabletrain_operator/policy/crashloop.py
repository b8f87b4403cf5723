"""Crash loops: relaunching cannot help when the job itself cannot start.

Seen in practice: pods that fail at import were relaunched again and again, each Event
saying only that workers failed. An attempt is a crash loop when every one of its ranks
failed before any completed a step, or when its failure ends with the same error as the
attempt before it without getting further (two SIGKILLs hours of training apart are two
incidents, not a loop: the restart budget bounds those). The policy (recovery.crashLoop)
then fails the job or backs off hard, and the message carries the failure's own words and
whose fault it looks like. The words are the failing rank's own error line and exit code
(observe/failure_cause.py), never torchrun's summary: that is what `kubectl describe`
shows first; status.lastFailure.message keeps the longer tail.
"""

from __future__ import annotations

from dataclasses import dataclass

from stabletrain_operator.api.spec import CrashLoopAction, CrashLoopSpec
from stabletrain_operator.api.status import FailureRecord
from stabletrain_operator.observe.culprit import failure_side


@dataclass(frozen=True)
class CrashLoop:
    action: CrashLoopAction
    message: str
    backoff_seconds: int | None


def crash_loop(
    spec: CrashLoopSpec,
    current: FailureRecord,
    previous: FailureRecord | None,
    *,
    every_rank_failed: bool,
) -> CrashLoop | None:
    """The crash loop this failure completes, or None for a failure worth a plain restart."""
    repeated = (
        previous is not None
        and previous.attempt == current.attempt - 1
        and previous.signature == current.signature
        and not _got_further(current, previous)
    )
    at_start = every_rank_failed and current.before_first_step
    if not (repeated or at_start):
        return None
    why = (
        f"the same error ended attempts {current.attempt - 1} and {current.attempt}"
        if repeated
        else f"every rank of attempt {current.attempt} failed before its first step"
    )
    side = failure_side(current, previous if repeated else None)
    fail = spec.action is CrashLoopAction.FAIL
    then = (
        "retrying cannot help, the job fails"
        if fail
        else f"the next relaunch waits {spec.backoff_seconds} s"
    )
    message = f"crash loop: {why}: {_words(current)}; looks like {side}; {then}"
    return CrashLoop(spec.action, message, None if fail else spec.backoff_seconds)


def _got_further(current: FailureRecord, previous: FailureRecord) -> bool:
    """The later attempt reached a step beyond the one the earlier failed at."""
    if current.step is None or previous.step is None:
        return False
    return current.step > previous.step


def _words(failure: FailureRecord) -> str:
    """The failing rank's exit code and its own error line, e.g. `the failing rank exited
    with code 2: train.py: error: unrecognized arguments: --bad`."""
    code, words = failure.exit_code, failure.signature
    if code is None or words.startswith("killed by signal") or "exit code" in words:
        return words
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return f"the failing rank {how}: {words}"
