"""What one tick saw, as the policy's observations, and whom a stop would be attributed to.

The state machine hands over what it observed (the attempt's pods, this tick's scrapes,
the heartbeats) with explicit arguments: the policy never imports the machine. Channels
are read in order of certainty: a manual request always, then the trip reports; only
without a trip a failed pod, and only without either a stall. Scraped findings always
count, and while a rollback is being confirmed they are recurrences of its incident.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.trip_report import TripReport
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import FailureRecord, StableTrainingJobStatus, Suspect
from stabletrain_operator.observe.culprit import (
    awaiting_peers,
    failure_record,
    failure_suspects,
    stall_suspects,
)
from stabletrain_operator.observe.pod_facts import PodFacts, PodState, failure_evidence
from stabletrain_operator.observe.stall import RankProgress, judge_stall
from stabletrain_operator.policy.action_registry import kind_of
from stabletrain_operator.policy.observation import (
    Observation,
    manual_request,
    scrape_observations,
    stalled,
    trip_observation,
    worker_failure,
)
from stabletrain_operator.policy.trips import awaiting_reports, reported_trips


@dataclass(frozen=True)
class Incident:
    """Who this tick's stop would be attributed to, and how the attempt failed."""

    suspects: tuple[Suspect, ...] = ()
    failure: FailureRecord | None = None
    every_rank_failed: bool = False


def gather_observations(
    status: StableTrainingJobStatus,
    spec: StableTrainingJobSpec,
    *,
    current: Sequence[PodFacts],
    fresh: Sequence[AgentStatus],
    progress: Sequence[RankProgress],
    now: datetime,
) -> tuple[list[Observation], list[TripReport], Incident]:
    """The observations to decide on, the attempt's trip reports, and the incident.

    `current` are the current attempt's pods, `fresh` this tick's scrapes of them and
    `progress` their newest heartbeats. While a rank that tripped waits for the others'
    reports (policy/trips.py), or a pod that exited with an error for the others still
    running (observe/culprit.py), only a manual request is observed.
    """
    observations: list[Observation] = []
    incident = Incident()
    manual = spec.manual_rollback
    if manual is not None and manual.request_id != status.last_manual_request_id:
        observations.append(
            manual_request(
                request_id=manual.request_id,
                step=status.step,
                to_step=manual.to_step,
                lr_factor=manual.lr_factor,
                skip=manual.skip,
                reason=manual.reason,
            )
        )
    trips = reported_trips(current, fresh, status.attempt)
    signals: list[Observation] = []
    if trips and awaiting_reports(trips, current, now):
        return observations, trips, incident
    if trips:
        signals.append(trip_observation(trips))
    else:
        broken = [p for p in current if p.state in (PodState.FAILED, PodState.GONE)]
        silent = _silent_running(current, progress)
        if awaiting_peers(broken, current, now, silent):
            return observations, trips, incident
        if broken:
            suspects = failure_suspects(broken, spec.workers.nodes, silent)
            evidence = "; ".join(failure_evidence(p) for p in broken)
            observations.append(worker_failure(step=status.step, evidence=evidence[:512]))
            incident = Incident(
                suspects=suspects,
                failure=failure_record(
                    status.attempt,
                    broken,
                    suspects,
                    progressed=status.attempt_progressed,
                    step=status.step,
                ),
                every_rank_failed=len(broken) >= spec.workers.nodes
                and all(p.state is PodState.FAILED for p in broken),
            )
        else:
            verdict = judge_stall(progress, stall_seconds=spec.detection.stall_seconds, now=now)
            if verdict is not None:
                observations.append(stalled(step=verdict.last_step, evidence=verdict.evidence))
                incident = Incident(suspects=stall_suspects(verdict))
    signals += scrape_observations(fresh)
    confirming = _confirming_onset(status)
    if confirming is not None:
        signals = [dataclasses.replace(o, recurrence_of=confirming) for o in signals]
    return observations + signals, trips, incident


def _silent_running(
    current: Sequence[PodFacts], progress: Sequence[RankProgress]
) -> list[PodFacts]:
    """Running pods whose agent answered earlier in this attempt (a heartbeat is known) and
    not this tick's scrape; none between scrapes, when `progress` is empty."""
    silent = {p.pod for p in progress if p.silent}
    return [p for p in current if p.state is PodState.RUNNING and p.name in silent]


def _confirming_onset(status: StableTrainingJobStatus) -> int | None:
    """The onset of the rollback being confirmed: a signal before it is confirmed is a
    recurrence of that incident, not a new one."""
    plan = status.plan
    if status.phase is not Phase.CONFIRMING or plan is None:
        return None
    if not kind_of(plan.action).goes_before_onset:
        return None
    return plan.onset_step
