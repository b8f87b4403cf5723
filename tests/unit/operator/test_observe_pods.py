"""Pod status -> facts: trip reports from termination messages, garbage messages kept as
text, OOM kills, deletions, foreign pods ignored."""

from __future__ import annotations

from typing import Any

import pytest
from operator_builders import record, trip

from stabletrain_contract.completion import Completion, render_completion
from stabletrain_contract.restore import render_restore_failure
from stabletrain_contract.trip_report import render_termination_message
from stabletrain_operator.observe.pod_facts import PodState, failure_evidence, pod_facts

LABELS = {"stabletrain.dev/job": "job", "stabletrain.dev/attempt": "2", "stabletrain.dev/rank": "1"}


def _pod(phase: str, terminated: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    statuses = [{"name": "trainer", "state": {"terminated": terminated}}] if terminated else []
    return {
        "metadata": {"name": "job-a2-1", "labels": LABELS, **meta},
        "spec": {"nodeName": "node-b"},
        "status": {"phase": phase, "podIP": "10.1.0.3", "containerStatuses": statuses},
    }


def test_trip_report_is_read_from_the_termination_message() -> None:
    report = trip("node-b", attempt=2, records=(record(10), record(20, pfs=False)))
    message = render_termination_message(report)
    facts = pod_facts(_pod("Failed", {"exitCode": 1, "reason": "Error", "message": message}))
    assert facts is not None
    assert (facts.attempt, facts.rank, facts.state, facts.node) == (2, 1, PodState.FAILED, "node-b")
    assert facts.trip == report


def test_restore_failure_is_read_from_the_termination_message() -> None:
    message = render_restore_failure(50, 2, "no restorable checkpoint of step 50")
    facts = pod_facts(_pod("Failed", {"exitCode": 1, "reason": "Error", "message": message}))
    assert facts is not None
    assert facts.restore_failure == (50, 2)
    assert facts.trip is None
    assert "RestoreFailed: step 50 of attempt 2" in failure_evidence(facts)
    other = pod_facts(_pod("Failed", {"exitCode": 1, "message": "RestoreFailed? no"}))
    assert other is not None
    assert other.restore_failure is None


def test_completion_is_read_from_the_termination_message() -> None:
    completion = Completion(step=300, attempt=2, loss=2.538881301879883)
    message = render_completion(completion)
    facts = pod_facts(_pod("Succeeded", {"exitCode": 0, "reason": "Completed", "message": message}))
    assert facts is not None
    assert facts.state is PodState.SUCCEEDED
    assert facts.completion == completion
    assert (facts.trip, facts.trip_error, facts.restore_failure) == (None, "", None)


def test_garbage_termination_message_is_kept_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    facts = pod_facts(_pod("Failed", {"exitCode": 1, "message": '{"signal": "LossSpike"'}))
    assert facts is not None
    assert facts.trip is None
    assert facts.trip_error
    assert "expected the agent's TripReport JSON" in caplog.text
    assert "LossSpike" in failure_evidence(facts)


def test_oom_kill_and_deletion() -> None:
    oom = pod_facts(_pod("Failed", {"exitCode": 137, "reason": "OOMKilled"}))
    assert oom is not None
    assert oom.reason == "OOMKilled"
    assert "OOMKilled with exit code 137" in failure_evidence(oom)
    deleting = pod_facts(_pod("Running", deletionTimestamp="2026-01-01T00:00:00Z"))
    assert deleting is not None
    assert deleting.state is PodState.GONE
    assert "deleted before it finished" in failure_evidence(deleting)


def test_evicted_pod_reason_comes_from_pod_status() -> None:
    pod = _pod("Failed")
    pod["status"]["reason"] = "Evicted"
    facts = pod_facts(pod)
    assert facts is not None
    assert facts.reason == "Evicted"


def test_pods_without_our_labels_are_ignored() -> None:
    pod = _pod("Running")
    pod["metadata"]["labels"] = {"stabletrain.dev/job": "job"}
    assert pod_facts(pod) is None


def _conditions(ready: str, containers_ready: str) -> list[dict[str, str]]:
    return [{"type": "ContainersReady", "status": containers_ready},
            {"type": "Ready", "status": ready}]  # fmt: skip


def test_a_pod_the_node_controller_marked_not_ready_is_on_a_silent_node() -> None:
    """Conditions as the local cluster showed them 9.6 s after its node was lost: Ready
    False, ContainersReady still True, no reason (the kubelet wrote nothing)."""
    pod = _pod("Running", deletionTimestamp="2026-12-02T04:32:10Z")
    pod["status"]["conditions"] = _conditions("False", "True")
    facts = pod_facts(pod)
    assert facts is not None
    assert (facts.state, facts.node_silent) == (PodState.GONE, True)
    assert failure_evidence(facts).endswith("its node having stopped reporting")


@pytest.mark.parametrize(
    ("ready", "containers_ready", "gates"),
    [("True", "True", False), ("False", "False", False), ("False", "True", True)],
    ids=["ready", "stopped-by-its-kubelet", "readiness-gates-unmet"],
)
def test_a_pod_is_on_a_silent_node_only_by_the_node_controllers_mark(
    ready: str, containers_ready: str, gates: bool
) -> None:
    pod = _pod("Running")
    pod["status"]["conditions"] = _conditions(ready, containers_ready)
    if gates:
        pod["spec"]["readinessGates"] = [{"conditionType": "example.com/attached"}]
    facts = pod_facts(pod)
    assert facts is not None
    assert not facts.node_silent
