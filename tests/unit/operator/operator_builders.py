"""Builders of the plain data the operator's pure modules take: specs, pods, agent statuses."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from stabletrain_contract.channel import AgentStatus, FindingReport
from stabletrain_contract.checkpoint.inventory import (
    CheckpointRecord,
    NodeCopy,
    TierCopy,
    compact_inventory,
)
from stabletrain_contract.completion import Completion
from stabletrain_contract.names import AnomalyClass
from stabletrain_contract.trip_report import TripReport
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.observe.pod_facts import PodFacts, PodState
from stabletrain_operator.observe.scrape import ScrapeResult

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NODES = ("node-a", "node-b")
TORCHRUN = ["torchrun", "train.py"]


def spec(**overrides: Any) -> StableTrainingJobSpec:
    data: dict[str, Any] = {
        "workers": {
            "nodes": 2,
            "template": {"spec": {"containers": [{"name": "trainer", "command": TORCHRUN}]}},
        },
        "checkpoints": {"local": {"hostPath": "/nvme"}, "pfs": {"claimName": "pfs"}},
        "recovery": {
            "rules": [
                {"name": "nan", "onSignals": ["NonFinite"], "action": "Rollback",
                 "rollback": {"minStepsBeforeOnset": 10, "skipStepsBeforeOnset": 2,
                              "skipStepsAfterOnset": 5, "rewarmupSteps": 4}},
                {"name": "spike", "onSignals": ["LossSpike"], "action": "Rollback",
                 "rollback": {"minStepsBeforeOnset": 10, "skipStepsBeforeOnset": 2,
                              "skipStepsAfterOnset": 5, "rewarmupSteps": 4}},
                {"name": "infra", "onSignals": ["WorkerFailure"], "action": "RestartFromLatest"},
                {"name": "grad", "onSignals": ["GradNormSpike"], "action": "Alert"},
            ],
            "budgets": {"maxRollbacks": 2, "maxRestarts": 2, "cooldownSeconds": 0},
            # These builders' pods run no supervisor: the tests of recreated pods. Restarts
            # in place have their own (test_machine_in_place.py).
            "restart": "RecreatePods",
        },
    }  # fmt: skip
    data.update(overrides)
    data["recovery"] = {"restart": "RecreatePods", **data["recovery"]}
    return StableTrainingJobSpec.model_validate(data)


def record(
    step: int, *, pfs: bool = True, stable: bool = True, attempt: int = 0
) -> CheckpointRecord:
    return CheckpointRecord(
        step=step,
        attempt=attempt,
        stable=stable,
        saved_at=T0,
        pfs=TierCopy(complete=pfs, verified=pfs),
        local=tuple(NodeCopy(node=n, complete=True, verified=True) for n in NODES),
    )


def trip(
    node: str, *, step: int = 57, onset: int = 55, signal: str = "NonFinite",
    records: tuple[CheckpointRecord, ...] = (), attempt: int = 0,
) -> TripReport:  # fmt: skip
    return TripReport(
        attempt=attempt,
        node=node,
        step=step,
        tripped_at=T0,
        signal=signal,
        anomaly_class=AnomalyClass.NUMERICAL,
        evidence="loss is NaN",
        onset_step=onset,
        last_good_step=onset - 1,
        inventory=compact_inventory(records, node),
    )


def pod(
    rank: int, *, attempt: int = 0, state: PodState = PodState.RUNNING,
    report: TripReport | None = None, reason: str = "", completion: Completion | None = None,
) -> PodFacts:  # fmt: skip
    return PodFacts(
        name=f"job-a{attempt}-{rank}",
        attempt=attempt,
        rank=rank,
        state=state,
        node=NODES[rank],
        ip=f"10.0.0.{rank + 2}",
        deleting=False,
        exit_code=1 if state is PodState.FAILED else None,
        reason=reason,
        trip=report,
        completion=completion,
    )


def agent(
    rank: int, *, attempt: int = 0, step: int = 10, generation: int = 1, lr_scale: float = 1.0,
    firing: tuple[FindingReport, ...] = (), records: tuple[CheckpointRecord, ...] = (),
    saved_request: int = 0, saved_step: int | None = None, latest_trip: TripReport | None = None,
    loss: float = 2.0,
) -> ScrapeResult:  # fmt: skip
    status = AgentStatus(
        attempt=attempt,
        node=NODES[rank],
        node_rank=rank,
        updated_at=T0,
        step=step,
        loss=loss,
        loss_baseline=2.0,
        grad_norm=1.0,
        lr_scale=lr_scale,
        tokens_per_second=1000.0,
        applied_generation=generation,
        firing=firing,
        inventory=records,
        saved_request=saved_request,
        saved_step=saved_step,
        latest_trip=latest_trip,
    )
    return ScrapeResult(pod=f"job-a{attempt}-{rank}", status=status)
