"""Replay reaches the decision the live operator reaches on the same history.

The "live" side here is the agent's SignalMonitor fed the rows one by one, the trip
reports the agent's own `build_trip_report` writes (one per pod) or the findings its
status endpoint shows, handed as pod facts and scrapes to the operator's pure state machine
(`machine.advance`), exactly as the kopf daemon hands them over. Its decision must equal,
field for field (numbers, rule, reason, message, evidence), the one replay reports for the
same step. Only the first decision of each history is compared: after it, the live run
relaunches, which is the end-to-end test's business.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from replay_histories import Row, history, write_csv

from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.signals.monitor import SignalMonitor, StepObservation
from stabletrain_contract.signals.trip_report_builder import build_trip_report
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.cli.replay.history import read_history
from stabletrain_operator.cli.replay.policy_file import ReplayPolicy, default_policy, read_policy
from stabletrain_operator.cli.replay.replay_loop import REPLAY_EPOCH, replay
from stabletrain_operator.machine import World, advance
from stabletrain_operator.observe.pod_facts import PodFacts, PodState
from stabletrain_operator.observe.scrape import ScrapeResult
from stabletrain_operator.policy import Decision, PolicyLedger, trip_signals

NODES = ("node-a", "node-b")
DOCS_POLICY = Path(__file__).resolve().parents[3] / "docs" / "policy.md"


def job_spec(policy: ReplayPolicy) -> StableTrainingJobSpec:
    return StableTrainingJobSpec.model_validate(
        {
            "workers": {"nodes": len(NODES), "template": {"spec": {"containers": [{"name": "t"}]}}},
            "checkpoints": {"local": {"hostPath": "/nvme"}, "pfs": {"claimName": "pfs"}},
            "detection": policy.detection.model_dump(by_alias=True),
            "recovery": policy.recovery.model_dump(by_alias=True),
        }
    )


def pod(rank: int, state: PodState, trip: Any = None) -> PodFacts:
    return PodFacts(
        name=f"job-a0-{rank}",
        attempt=0,
        rank=rank,
        state=state,
        node=NODES[rank],
        ip=f"10.0.0.{rank + 2}",
        deleting=False,
        exit_code=1 if state is PodState.FAILED else None,
        trip=trip,
    )


def live_first_decision(rows: list[Row], policy: ReplayPolicy) -> tuple[int, Decision] | None:
    """The agent's monitor step by step; the operator's machine whenever there is news."""
    spec = job_spec(policy)
    monitor = SignalMonitor(policy.detection, trip_signals(policy.recovery))
    for index, row in enumerate(rows):
        custom = {
            k: float(v) for k, v in row.items() if k not in {"step", "loss", "grad_norm", "lr"}
        }
        verdict = monitor.observe(
            StepObservation(
                step=int(row["step"]),
                loss=float(row["loss"]),
                grad_norm=float(row["grad_norm"]),
                lr=float(row["lr"]),
                tokens_per_second=None,
                custom=custom,
                checkpoint_in_flight=False,
                steps_since_start=index,
            )
        )
        if verdict.trip:
            reports = [
                build_trip_report(
                    verdict,
                    attempt=0,
                    node=node,
                    last_good_step=monitor.last_good_step,
                    inventory=(),
                    lineage_path="",
                )
                for node in NODES
            ]
            pods = tuple(pod(r, PodState.FAILED, reports[r]) for r in range(len(NODES)))
            scrapes: tuple[ScrapeResult, ...] = ()
        elif any(f.sustained for f in verdict.findings):
            pods = tuple(pod(r, PodState.RUNNING) for r in range(len(NODES)))
            firing = tuple(f.to_report() for f in verdict.findings)
            scrapes = tuple(
                ScrapeResult(
                    pod=f"job-a0-{r}",
                    status=AgentStatus(
                        attempt=0,
                        node=NODES[r],
                        node_rank=r,
                        updated_at=datetime(2026, 1, 1, tzinfo=UTC),
                        step=verdict.step,
                        lr_scale=1.0,
                        applied_generation=1,
                        firing=firing,
                    ),
                )
                for r in range(len(NODES))
            )
        else:
            continue
        status = StableTrainingJobStatus(
            phase=Phase.RUNNING, attempt=0, directives_generation=1, step=verdict.step
        )
        world = World(
            now=REPLAY_EPOCH + timedelta(seconds=verdict.step),
            job="job",
            spec=spec,
            generation=1,
            pods=pods,
            scrapes=scrapes,
            ledger=PolicyLedger(),
        )
        decision = advance(status, world).decision
        if decision is not None:
            return verdict.step, decision
    return None


def spike(first: int, last: int, factor: float = 2.2) -> Any:
    return lambda step, healthy: healthy * factor if first <= step <= last else healthy


def nan_from(first: int) -> Any:
    return lambda step, healthy: float("nan") if step >= first else healthy


def compound(step: int) -> dict[str, float | str]:
    return {
        "val_loss": 3.0 * (1.2 if 1000 <= step < 1010 else 1.0),
        "moe_aux_loss": 0.02,
        "entropy": 0.7 if step >= 1500 else 2.0,
        "reward": 1.3 if step >= 1480 else 1.0,
    }


def grad_spike(step: int) -> dict[str, float | str]:
    return {"grad_norm": 9.0} if 900 <= step < 950 else {}


SCENARIOS = {
    "loss spike, default policy": (history(range(2000), loss=spike(1500, 1600)), None),
    "NaN, default policy": (history(range(2000), loss=nan_from(1200)), None),
    "grad-norm spike alert, default policy": (history(range(2000), extra=grad_spike), None),
    "validation loss alert, docs policy": (history(range(1400), extra=compound), "docs"),
    "entropy low while reward rises, docs policy": (
        history(range(2000), extra=lambda s: {**compound(s), "val_loss": 3.0}),
        "docs",
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_replay_and_the_live_operator_take_the_same_first_decision(
    name: str, tmp_path: Path
) -> None:
    rows, which = SCENARIOS[name]
    policy = default_policy()
    if which == "docs":
        block = DOCS_POLICY.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
        (tmp_path / "policy.yaml").write_text(block)
        policy = read_policy(tmp_path / "policy.yaml")
    live = live_first_decision(rows, policy)
    assert live is not None, "the scenario must make the live side decide"
    replayed = replay(read_history(write_csv(tmp_path / "m.csv", rows)), policy).decisions
    assert replayed, "replay decided nothing"
    assert (replayed[0].step, replayed[0].decision) == live
