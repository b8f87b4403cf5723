"""The optional node remediation: when a node is due, and the patch that takes it out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from stabletrain_operator.api.status import SuspectNode
from stabletrain_operator.remediation import (
    REASON_ANNOTATION,
    TAINT_KEY,
    NodeAction,
    NodeRemediation,
    due,
    node_patch,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def suspect(node: str, incidents: int) -> SuspectNode:
    return SuspectNode(node=node, incidents=incidents, last_reason="killed by signal 9",
                       last_incident_at=T0, expires_at=T0 + timedelta(hours=1))  # fmt: skip


def test_the_flag_reads_action_and_count_and_names_a_bad_value() -> None:
    assert NodeRemediation.parse("Cordon:2") == NodeRemediation(NodeAction.CORDON, 2)
    for bad in ("Taint", "Drain:2", "Taint:0", "Taint:x"):
        with pytest.raises(ValueError, match="Taint:N or Cordon:N"):
            NodeRemediation.parse(bad)


def test_a_node_is_due_once_when_its_count_reaches_the_threshold() -> None:
    rule = NodeRemediation(NodeAction.TAINT, 2)
    assert due([], [suspect("b", 1)], rule) == []
    assert due([suspect("b", 1)], [suspect("b", 2)], rule) == [suspect("b", 2)]
    assert due([suspect("b", 2)], [suspect("b", 2), suspect("c", 1)], rule) == []
    assert due([suspect("b", 2)], [suspect("b", 3)], rule) == [suspect("b", 3)]


def test_the_taint_keeps_other_taints_and_the_annotation_says_why() -> None:
    other = {"key": "gpu", "value": "a100", "effect": "NoSchedule"}
    old = {"key": TAINT_KEY, "value": "ml.old", "effect": "NoSchedule"}
    patch = node_patch(suspect("b", 3), [other, old], NodeAction.TAINT, "ml/gpt", "41")
    assert patch["spec"]["taints"] == [
        other, {"key": TAINT_KEY, "value": "ml.gpt", "effect": "NoSchedule"}
    ]  # fmt: skip
    reason = patch["metadata"]["annotations"][REASON_ANNOTATION]
    assert reason == "ml/gpt: culprit of 3 incident(s): killed by signal 9"
    assert patch["metadata"]["resourceVersion"] == "41"  # the list replaced is the one read
    cordon = node_patch(suspect("b", 3), [other], NodeAction.CORDON, "ml/gpt", "41")
    assert cordon["spec"] == {"unschedulable": True}
