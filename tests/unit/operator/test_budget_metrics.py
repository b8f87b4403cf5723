"""The per-job budget gauge: what a reconcile step leaves in it and that it leaves with the job."""

from __future__ import annotations

from operator_builders import spec
from prometheus_client import generate_latest

from stabletrain_operator import metrics
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.machine import Transition
from stabletrain_operator.policy.ledger import PolicyLedger
from stabletrain_operator.reconcile import JobKey, _record_metrics


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
