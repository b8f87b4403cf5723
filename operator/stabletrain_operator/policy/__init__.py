"""The recovery policy as pure functions: observations in, one decision out.

No kopf, no Kubernetes client, no I/O and no clock: the operator passes the time in and
persists the ledger; the replay CLI runs the same code on a recorded history.
"""

from stabletrain_operator.policy.decision import Decision, Deferral, Evaluation
from stabletrain_operator.policy.engine import decide, evaluate, record, trip_signals
from stabletrain_operator.policy.ledger import AlertEpisode, PolicyLedger, RollbackMemory
from stabletrain_operator.policy.observation import (
    Observation,
    ObservationSource,
    finding_observation,
    manual_request,
    scrape_observations,
    stalled,
    trip_observation,
    worker_failure,
)

__all__ = [
    "AlertEpisode",
    "Decision",
    "Deferral",
    "Evaluation",
    "Observation",
    "ObservationSource",
    "PolicyLedger",
    "RollbackMemory",
    "decide",
    "evaluate",
    "finding_observation",
    "manual_request",
    "record",
    "scrape_observations",
    "stalled",
    "trip_observation",
    "trip_signals",
    "worker_failure",
]
