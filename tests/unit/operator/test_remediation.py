"""The optional node remediation: which evidence counts, when a node is due, and the patch
that takes it out."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from typing import Any, cast

import pytest

from stabletrain_operator import reconcile
from stabletrain_operator.api.status import SuspectNode
from stabletrain_operator.apiserver import ApiError
from stabletrain_operator.kube import Kube
from stabletrain_operator.remediation import (
    REASON_ANNOTATION,
    TAINT_KEY,
    TAINT_VALUE,
    NodeAction,
    NodeRemediation,
    NodeVerdict,
    NodeVotes,
    node_patch,
    tainted,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
"""A Kubernetes label value (what a taint's value must be), at most 63 characters."""


def suspect(node: str, incidents: int, lost: int, *, at: datetime = T0) -> SuspectNode:
    return SuspectNode(node=node, incidents=incidents, node_lost_incidents=lost,
                       last_reason=f"pod on node {node} was lost", last_incident_at=at,
                       expires_at=at + timedelta(hours=1))  # fmt: skip


def test_the_flag_reads_action_and_count_and_names_a_bad_value() -> None:
    assert NodeRemediation.parse("Cordon:2") == NodeRemediation(NodeAction.CORDON, 2)
    assert NodeRemediation.parse("Cordon:2").jobs == 2, "two jobs by default"
    for bad in ("Taint", "Drain:2", "Taint:0", "Taint:x"):
        with pytest.raises(ValueError, match="Taint:N or Cordon:N"):
            NodeRemediation.parse(bad)


def test_incidents_the_job_could_forge_never_count() -> None:
    """OOM kills, exit codes and `exitcode: -N` in a termination message make a node a
    suspect of the job itself (incidents), never a vote for remediation."""
    votes = NodeVotes()
    rule = NodeRemediation(NodeAction.TAINT, 1, jobs=1)
    grew = votes.record("a/one", [suspect("b", incidents=5, lost=0)])
    assert grew == set()
    assert votes.due(rule, {"b"}, T0) == []


def test_one_job_alone_never_takes_a_node_out_by_default() -> None:
    votes = NodeVotes()
    rule = NodeRemediation(NodeAction.TAINT, 2)
    assert votes.record("a/one", [suspect("b", 3, 3)]) == {"b"}
    assert votes.due(rule, {"b"}, T0) == [], "three losses, but all of one job"
    assert votes.record("z/two", [suspect("b", 1, 1)]) == {"b"}
    assert votes.due(rule, {"b"}, T0) == [
        NodeVerdict("b", ("a/one", "z/two"), 4, "pod on node b was lost")
    ]


def test_only_growing_counts_and_unexpired_incidents_are_judged() -> None:
    votes = NodeVotes()
    rule = NodeRemediation(NodeAction.CORDON, 2, jobs=2)
    votes.record("a/one", [suspect("b", 1, 1)])
    assert votes.record("a/one", [suspect("b", 2, 1)]) == set(), "a forgeable incident only"
    votes.record("z/two", [suspect("b", 1, 1, at=T0 - timedelta(hours=2))])
    assert votes.due(rule, {"b"}, T0) == [], "the other job's loss expired an hour ago"
    votes.forget("a/one")
    votes.record("z/two", [suspect("b", 2, 2)])
    assert votes.due(rule, {"b"}, T0) == [], "a deleted job's votes are gone"


def test_the_taint_value_is_a_valid_label_value_whatever_the_jobs_are_called() -> None:
    """Cut at 63 characters, `<namespace>.<job>` could end in '-' or '.', which the API
    server refuses; the value now names the evidence, the annotation names the jobs."""
    name = "a" * 61 + "-b"
    verdict = NodeVerdict("b", (f"team/{name}", f"other/{name}"), 3, "pod was lost")
    other = {"key": "gpu", "value": "a100", "effect": "NoSchedule"}
    old = {"key": TAINT_KEY, "value": "team.x", "effect": "NoSchedule"}
    patch = node_patch(verdict, [other, old], NodeAction.TAINT, "41")
    assert patch["spec"]["taints"] == [
        other, {"key": TAINT_KEY, "value": TAINT_VALUE, "effect": "NoSchedule"}
    ]  # fmt: skip
    assert LABEL_VALUE.fullmatch(TAINT_VALUE)
    assert len(TAINT_VALUE) <= 63
    reason = patch["metadata"]["annotations"][REASON_ANNOTATION]
    assert reason.startswith(f"lost the pods of 2 job(s) (team/{name}, other/{name}) 3 time(s)")
    assert patch["metadata"]["resourceVersion"] == "41"  # the list replaced is the one read
    cordon = node_patch(verdict, [other], NodeAction.CORDON, "41")
    assert cordon["spec"] == {"unschedulable": True}
    assert tainted(patch["spec"]["taints"])
    assert not tainted([other])


class ConflictedNode:
    """A node other writers change between each read and patch, `conflicts` times (the
    kubelet's status, the node lifecycle's taints); it counts reads and patches."""

    def __init__(self, conflicts: int) -> None:
        self.conflicts = conflicts
        self.reads = 0
        self.patched: list[dict[str, Any]] = []

    def node_taints(self, name: str) -> tuple[list[dict[str, Any]], str]:
        self.reads += 1
        return [], str(self.reads)

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        if self.reads <= self.conflicts:
            raise ApiError(HTTPStatus.CONFLICT, "Conflict", "the object has been modified")
        self.patched.append(patch)


def test_a_node_patch_reads_again_after_each_conflict_with_a_growing_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(reconcile.time, "sleep", pauses.append)
    node = ConflictedNode(conflicts=reconcile.NODE_PATCH_ATTEMPTS - 1)
    verdict = NodeVerdict("b", ("a/one",), 1, "pod was lost")
    assert reconcile._patch_node(cast(Kube, node), verdict, NodeAction.TAINT)
    assert node.reads == reconcile.NODE_PATCH_ATTEMPTS
    assert [p["metadata"]["resourceVersion"] for p in node.patched] == [str(node.reads)]
    assert pauses == sorted(pauses)
    assert len(set(pauses)) == len(pauses) == node.reads - 1


def test_a_node_that_keeps_changing_is_left_alone_after_the_last_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reconcile.time, "sleep", lambda _: None)
    node = ConflictedNode(conflicts=reconcile.NODE_PATCH_ATTEMPTS)
    verdict = NodeVerdict("b", ("a/one",), 1, "pod was lost")
    with pytest.raises(ApiError, match="409"):
        reconcile._patch_node(cast(Kube, node), verdict, NodeAction.TAINT)
    assert node.reads == reconcile.NODE_PATCH_ATTEMPTS
    assert not node.patched
