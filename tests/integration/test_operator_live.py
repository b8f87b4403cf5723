"""Live actions: a ReduceLR rule lowers the LR of running pods over the authenticated
directive channel without a restart; an Alert rule changes nothing but status, an Event
and a metric."""

from __future__ import annotations

import json
from typing import Any

from test_operator_rollback import metric, worker_log

from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess, job_manifest

GRAD_SPIKE = {"ST_STEP_SECONDS": "0.15", "ST_STEPS": "70", "ST_GRAD_SPIKE_AT": "25",
              "ST_GRAD_SPIKE_LEN": "40"}  # fmt: skip
GRAD_SPIKE_SUSTAINED_STEP = 25 + 4 - 1
"""The spike's 4th step: detection.gradNormSpike.consecutiveSteps defaults to 4."""


def test_reduce_lr_rule_lowers_the_lr_live_without_a_restart(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    rules = [{"name": "grad", "onSignals": ["GradNormSpike"], "action": "ReduceLR"}]
    recovery = {"rules": rules, "budgets": {"cooldownSeconds": 3600}}
    jobs.create(job_manifest("live", GRAD_SPIKE, recovery=recovery))

    reduced = jobs.wait("live", lambda s: s.get("lrScale") == 0.5, 120, "the LR to be halved")
    assert reduced["directivesGeneration"] == 2
    done = jobs.wait("live", lambda s: s.get("phase") == "Succeeded", 120, "the job to finish")
    assert done["attempt"] == 0, "no restart"
    assert done["counters"]["lrReductions"] == 1
    assert done["counters"]["rollbacks"] == done["counters"]["restarts"] == 0
    (recorded,) = done["rollbackHistory"]
    assert (recorded["action"], recorded["reason"], recorded["lrScale"]) == (
        "ReduceLR", "LRReduced", 0.5,
    )  # fmt: skip
    logs = {rank: worker_log(local_cluster, job_namespace, attempt=0, rank=rank) for rank in (0, 1)}
    # The pods run their loops unsynchronised, so "after" is judged by the clock: the first
    # pod to log the spike's sustained step published it just before writing that line.
    sustained_at = min(
        next(r["time"] for r in steps if r["step"] == GRAD_SPIKE_SUSTAINED_STEP)
        for steps in logs.values()
    )
    for rank, steps in logs.items():
        changed = next(r for r in steps if r["generation"] == 2)
        assert changed["lrScale"] == 0.5
        assert changed["time"] > sustained_at, "after the spike was sustained"
        assert all(r["lrScale"] == 0.5 for r in steps if r["step"] > changed["step"])
        lag = changed["time"] - sustained_at
        print(f"rank {rank}: generation 2 (LR scale 0.5) applied live at step {changed['step']}, "
              f"{lag:.2f} s after the spike was sustained")  # fmt: skip
    reasons = [e["reason"] for e in jobs.events("live")]
    assert "LRReduced" in reasons or any("ReduceLR" in e["message"] for e in jobs.events("live"))
    assert metric(operator, "stabletrain_operator_decisions_total", action="ReduceLR") == 1


def test_alert_rule_changes_only_status_event_and_metric(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    rules = [{"name": "grad", "onSignals": ["GradNormSpike"], "action": "Alert"}]
    jobs.create(job_manifest("alert", GRAD_SPIKE, recovery={"rules": rules}))

    alerted = jobs.wait("alert", lambda s: s.get("counters", {}).get("alerts") == 1, 120,
                        "an alert")  # fmt: skip
    healthy = next(c for c in alerted["conditions"] if c["type"] == "Healthy")
    assert (healthy["status"], healthy["reason"]) == ("False", "Alerted")
    done = jobs.wait("alert", lambda s: s.get("phase") == "Succeeded", 120, "the job to finish")
    assert done["attempt"] == 0
    assert done["lrScale"] == 1
    assert done["directivesGeneration"] == 1
    assert done["counters"]["alerts"] == 1, "one alert for the episode"
    (recorded,) = done["rollbackHistory"]  # on the record, and nothing relaunched
    assert (recorded["action"], recorded["reason"], recorded["signal"], recorded["attempt"]) == (
        "Alert", "Alerted", "GradNormSpike", 0,
    )  # fmt: skip
    assert metric(operator, "stabletrain_operator_alerts_total", signal="GradNormSpike") == 1
    warnings = [e for e in jobs.events("alert") if e["type"] == "Warning"]
    assert any("GradNormSpike" in e["message"] or "Alert" in e["message"] for e in warnings)
    steps = worker_log(local_cluster, job_namespace, attempt=0, rank=0)
    assert {r["generation"] for r in steps} == {1}
    assert {r["lrScale"] for r in steps} == {1.0}
    directives: dict[str, Any] = json.loads(
        jobs.config_map("alert-a0-directives")["data"]["directives.json"]
    )
    assert "GradNormSpike" not in directives["tripOn"], "Alert signals only report"
