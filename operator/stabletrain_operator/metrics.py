"""The operator's own Prometheus metrics, on a private registry served on its own port.

Labels carry only small fixed sets (signal, action, error kind), never a job's step; the
budget gauge alone is per job (jobs are few), and its series go when the job goes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

ROLLBACKS = Counter(
    "stabletrain_operator_rollbacks",
    "Rollbacks started, by the signal that caused them.",
    ["signal"],
    registry=REGISTRY,
)
DECISIONS = Counter(
    "stabletrain_operator_decisions",
    "Policy decisions carried out, by action.",
    ["action"],
    registry=REGISTRY,
)
JOBS_FAILED = Counter(
    "stabletrain_operator_jobs_failed",
    "Jobs that ended Failed, by the reason of their Failed condition: a policy's Fail "
    "decision, and also a failure no decision made (no usable checkpoint, a restore that "
    "failed everywhere).",
    ["reason"],
    registry=REGISTRY,
)
ALERTS = Counter(
    "stabletrain_operator_alerts",
    "Alert decisions, by signal.",
    ["signal"],
    registry=REGISTRY,
)
RECOVERY_SECONDS = Histogram(
    "stabletrain_operator_recovery_duration_seconds",
    "From the decision to stop a run to the creation of the next attempt's pods.",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
SCRAPE_ERRORS = Counter(
    "stabletrain_operator_scrape_errors",
    "Agent status scrapes that gave nothing usable, by kind.",
    ["kind"],
    registry=REGISTRY,
)
SCRAPES = Counter(
    "stabletrain_operator_scrapes",
    "Agent status scrapes attempted.",
    registry=REGISTRY,
)
SCRAPE_RATE = Gauge(
    "stabletrain_operator_scrape_rate",
    "Agent status scrapes a second healthy jobs get now: the --scrape-rate ceiling while the "
    "event loop keeps up, less while it lags (observe/pacing.py).",
    registry=REGISTRY,
)
LOOP_LAG = Gauge(
    "stabletrain_operator_event_loop_lag_seconds",
    "How late a short timer fired on the operator's event loop, mean over the last "
    "adjustment period: the wait of every watch event and tick.",
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "stabletrain_operator_reconcile_errors",
    "Reconcile ticks that failed (API errors, conflicts); the next tick retries.",
    ["kind"],
    registry=REGISTRY,
)
BUDGET_REMAINING = Gauge(
    "stabletrain_operator_budget_remaining",
    "Rollbacks (budgets.maxRollbacks) and restarts (budgets.maxRestarts) a job may still "
    "take; the policy fails the job when it needs one more at 0.",
    # Not `namespace`/`job`: Prometheus's own target labels would rename them to exported_*.
    ["stabletrain_namespace", "stabletrain_job", "kind"],
    registry=REGISTRY,
)
BUDGET_KINDS = ("rollback", "restart")


def set_budget_remaining(namespace: str, job: str, *, rollbacks: int, restarts: int) -> None:
    BUDGET_REMAINING.labels(namespace, job, "rollback").set(max(rollbacks, 0))
    BUDGET_REMAINING.labels(namespace, job, "restart").set(max(restarts, 0))


def forget_job(namespace: str, job: str) -> None:
    """Drop a deleted job's series, so no alert fires on a job that no longer exists."""
    for kind in BUDGET_KINDS:
        BUDGET_REMAINING.remove(namespace, job, kind)  # a label set never set: nothing to do


def serve(port: int, address: str = "0.0.0.0") -> None:
    """Serve /metrics in a daemon thread."""
    start_http_server(port, addr=address, registry=REGISTRY)
