"""The per-job budget gauge: what a reconcile step leaves in it and that it leaves with the job;
and the count of failed jobs the critical alert reads."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from operator_builders import spec
from prometheus_client import generate_latest

from stabletrain_operator import metrics
from stabletrain_operator.api.constants import Phase, Reason
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.conditions.job import set_failed
from stabletrain_operator.machine import Transition
from stabletrain_operator.policy.ledger import PolicyLedger
from stabletrain_operator.reconcile import JobKey, _count_failed, _record_metrics


def budget(namespace: str, job: str, kind: str) -> float | None:
    labels = {"stabletrain_namespace": namespace, "stabletrain_job": job, "kind": kind}
    return metrics.REGISTRY.get_sample_value("stabletrain_operator_budget_remaining", labels)


def test_a_step_sets_what_remains_of_both_budgets_and_deletion_drops_them() -> None:
    key = JobKey("team-a", "gpt-budget")
    ledger = PolicyLedger(rollbacks_used=1, restarts_used=3)
    _record_metrics(
        key, spec().recovery, Transition(status=StableTrainingJobStatus(), ledger=ledger)
    )

    assert budget("team-a", "gpt-budget", "rollback") == 1.0  # maxRollbacks 2, one used
    assert budget("team-a", "gpt-budget", "restart") == 0.0  # maxRestarts 2, over-used: 0
    assert b"stabletrain_operator_budget_remaining{" in generate_latest(metrics.REGISTRY)

    metrics.forget_job("team-a", "gpt-budget")
    assert budget("team-a", "gpt-budget", "rollback") is None
    assert budget("team-a", "gpt-budget", "restart") is None
    metrics.forget_job("team-a", "gpt-budget")  # a second time (or never set): no error


def failed_jobs(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "stabletrain_operator_jobs_failed_total", {"reason": reason}
    )
    return value or 0.0


def test_a_job_that_fails_without_a_decision_is_counted_once() -> None:
    """NoUsableCheckpoint ends a job with no policy decision: the Fail decisions' counter
    missed it, and so did the alert that pages on failed jobs."""
    failed = set_failed(
        StableTrainingJobStatus(phase=Phase.FAILED),
        SimpleNamespace(now=datetime.now(UTC), generation=1),
        reason=Reason.NO_CHECKPOINT,
        message="no checkpoint far enough before the onset",
    )
    before = failed_jobs(Reason.NO_CHECKPOINT)

    _count_failed(Phase.PLANNING, failed)
    assert failed_jobs(Reason.NO_CHECKPOINT) == before + 1
    _count_failed(Phase.FAILED, failed)  # a finished job's later ticks
    assert failed_jobs(Reason.NO_CHECKPOINT) == before + 1
