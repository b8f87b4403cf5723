"""The termination message of pods that cannot restore the step their directives name.

The operator chose the step from the inventory it had; if the pods cannot find a verified
copy of exactly that step (retention removed it, a tier lost it, it fails verification)
they must not load another one: a different step is a decision the operator did not take,
and an older-than-planned or a newer one may lie inside the spike. They stop instead and
leave this message, which the operator reads from the pod status to re-plan the same action
without that step. It is plain text (never JSON, which is the trip report's form) with a
fixed prefix, so a person reading `kubectl describe pod` understands it too.
"""

from __future__ import annotations

import re

from stabletrain_contract.trip_report import TERMINATION_MESSAGE_LIMIT

RESTORE_FAILED_PREFIX = "RestoreFailed"
RESTORE_EXIT_CODE = 4
"""Exit code of a worker that could not restore its planned step (torchrun reports 1)."""
_PATTERN = re.compile(rf"^{RESTORE_FAILED_PREFIX}: step (\d+) of attempt (\d+): ")


def render_restore_failure(step: int, attempt: int, reason: str) -> str:
    """`RestoreFailed: step N of attempt A: <why>`, cut to fit the termination message."""
    message = f"{RESTORE_FAILED_PREFIX}: step {step} of attempt {attempt}: {reason}"
    return message.encode()[:TERMINATION_MESSAGE_LIMIT].decode(errors="ignore")


def parse_restore_failure(message: str) -> tuple[int, int] | None:
    """(step, attempt) of a restore failure message; None for any other message."""
    match = _PATTERN.match(message.strip())
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))
