"""How replayed decisions are printed: JSON lines for machines, a readable block for people."""

from __future__ import annotations

import json
from typing import Any

from stabletrain_operator.cli.replay.replay_loop import ReplayedDecision
from stabletrain_operator.finite import non_finite_replaced


def decision_record(replayed: ReplayedDecision) -> dict[str, Any]:
    """The JSON object of one decision; `step`, `signal` and `action` lead, as documented."""
    decision = replayed.decision
    return {
        "step": replayed.step,
        "signal": decision.signal,
        "action": decision.action.value,
        "rule": decision.rule,
        "reason": decision.reason,
        "class": None if decision.anomaly_class is None else decision.anomaly_class.value,
        "onset": decision.onset_step,
        "lr_scale": decision.lr_scale,
        "skip": [[r.first, r.last] for r in decision.skip],
        "target_step_at_most": decision.target_step_at_most,
        "rewarmup_steps": decision.rewarmup_steps,
        "escalation_level": decision.escalation_level,
        "message": decision.message,
        "evidence": decision.evidence,
    }


def json_line(replayed: ReplayedDecision) -> str:
    """One line of strict JSON (no NaN tokens: a non-finite number is written as a string)."""
    return json.dumps(non_finite_replaced(decision_record(replayed), str), allow_nan=False)


def text_block(replayed: ReplayedDecision) -> str:
    decision = replayed.decision
    klass = "" if decision.anomaly_class is None else f" ({decision.anomaly_class.value})"
    onset = "" if decision.onset_step is None else f", onset {decision.onset_step}"
    lines = [
        f"step {replayed.step}: {decision.action.value} by rule {decision.rule} "
        f"[{decision.reason}] on {decision.signal}{klass}{onset}",
        f"  {decision.message}",
    ]
    if decision.skip:
        ranges = ", ".join(f"{r.first}-{r.last}" for r in decision.skip)
        lines.append(f"  skip steps {ranges}; target checkpoint <= {decision.target_step_at_most}")
    if decision.evidence:
        lines.append(f"  evidence: {decision.evidence}")
    return "\n".join(lines)
