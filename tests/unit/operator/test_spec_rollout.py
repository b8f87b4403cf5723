"""A running job's spec edits, through the state machine: what reaches the pods live, when it
comes into force (status.policy, observedGeneration, SpecApplied), how a trip that raced
the edit is decided, what waits for the next attempt, and what a policy limit refuses."""

from __future__ import annotations

from typing import Any

from operator_builders import T0, agent, pod, spec, trip

from stabletrain_contract.channel import FindingReport
from stabletrain_contract.checkpoint.settings import CheckpointSettings
from stabletrain_contract.names import Action, AnomalyClass
from stabletrain_operator.api.cluster_policy import StableTrainingPolicy
from stabletrain_operator.api.constants import ConditionType, Phase, Reason
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.machine import Transition, World, advance
from stabletrain_operator.observe.pod_facts import PodState
from stabletrain_operator.plan.sent_directives import attempt_directives
from stabletrain_operator.platform_policy.effective import EffectivePolicy, effective_policy
from stabletrain_operator.policy import PolicyLedger

SPIKE_ALERTS = [
    {"name": "nan", "onSignals": ["NonFinite"], "action": "Rollback"},
    {"name": "spike", "onSignals": ["LossSpike"], "action": "Alert"},
    {"name": "infra", "onSignals": ["WorkerFailure"], "action": "RestartFromLatest"},
]
"""The issue's edit: LossSpike only alerts now, the other rules unchanged."""


def edited(**recovery: Any) -> StableTrainingJobSpec:
    base = spec().recovery.model_dump(by_alias=True, exclude_unset=True)
    return spec(recovery={**base, **recovery})


def base_directives(job: StableTrainingJobSpec) -> Any:
    return attempt_directives(
        job, generation=1, attempt=0, resume_step=None, lr_scale=1.0, rewarmup_steps=0, skip=()
    )


def world(status: StableTrainingJobStatus, **changes: Any) -> World:
    base: dict[str, Any] = {
        "now": T0,
        "job": "job",
        "spec": spec(),
        "generation": 1,
        "pods": (pod(0), pod(1)),
        "ledger": PolicyLedger.from_job_status(status),
        "previous_nodes": ("node-a", "node-b"),
        "attempt_directives": base_directives(spec()),
    }
    base.update(changes)
    return World(**base)


def launched() -> StableTrainingJobStatus:
    """A job whose first attempt was just launched under spec() (generation 1)."""
    first = advance(StableTrainingJobStatus(), world(StableTrainingJobStatus(), pods=()))
    assert first.launch is not None
    return first.status


def condition(step: Transition) -> tuple[str, str, str]:
    found = next(c for c in step.status.conditions if c.type == ConditionType.SPEC_APPLIED)
    return found.status, found.reason, found.message


def test_an_edit_of_what_trips_is_sent_live_and_is_in_force_once_every_pod_applied_it() -> None:
    status = launched()
    assert status.policy is not None
    assert (status.observed_generation, status.policy.spec_generation) == (1, 1)
    assert status.built_from is not None
    assert "LossSpike" in [s for r in status.policy.recovery.rules for s in r.on_signals]

    sent = advance(status, world(status, spec=edited(rules=SPIKE_ALERTS), generation=2))
    assert sent.live is not None, "the edit goes to the running pods, not to a next attempt"
    assert sent.live.generation == 2
    assert sent.live.trip_on == ("NonFinite",)
    assert sent.live.trip_rules is not None
    assert [r.stops for r in sent.live.trip_rules] == [True, False]
    assert sent.live_pods == ("job-a0-0", "job-a0-1")
    assert sent.status.directives_generation == 2
    assert sent.status.policy == status.policy, "not in force before the pods applied it"
    assert sent.status.observed_generation == 1
    assert condition(sent)[:2] == ("False", Reason.AWAITING_PODS)
    (event,) = [e for e in sent.events if e.reason == Reason.AWAITING_PODS]
    assert "trip on NonFinite, was NonFinite, LossSpike" in event.message

    one = advance(
        sent.status,
        world(
            sent.status,
            spec=edited(rules=SPIKE_ALERTS),
            generation=2,
            scrapes=(agent(0, generation=2), agent(1, generation=1)),
        ),
    )
    assert one.status.observed_generation == 1, "one pod of two is not enough"
    assert one.live is not None
    assert one.live_pods == ("job-a0-1",), "the lagging pod gets it again"
    both = advance(
        one.status,
        world(
            one.status,
            spec=edited(rules=SPIKE_ALERTS),
            generation=2,
            scrapes=(agent(0, generation=2), agent(1, generation=2)),
        ),
    )
    assert both.status.policy is not None
    assert both.status.policy_rollout is None
    assert (both.status.observed_generation, both.status.policy.spec_generation) == (2, 2)
    assert both.status.policy.directives_generation == 2
    assert condition(both)[:2] == ("True", Reason.SPEC_IN_FORCE)
    assert "the pods run spec generation 2 (directives generation 2)" in condition(both)[2]
    assert [e.reason for e in both.events] == [Reason.SPEC_IN_FORCE]


def spike(*, sustained: bool = True) -> FindingReport:
    return FindingReport(
        signal="LossSpike",
        anomaly_class=AnomalyClass.DIVERGENCE,
        value=7.0,
        threshold=1.6,
        onset_step=129,
        consecutive=4,
        sustained=sustained,
    )


def test_once_in_force_a_spike_only_alerts_and_nothing_stops() -> None:
    status = launched()
    edit = edited(rules=SPIKE_ALERTS)
    sent = advance(status, world(status, spec=edit, generation=2))
    applied = advance(
        sent.status,
        world(
            sent.status,
            spec=edit,
            generation=2,
            scrapes=(agent(0, generation=2), agent(1, generation=2)),
        ),
    )
    firing = (
        agent(0, generation=2, step=132, firing=(spike(),)),
        agent(1, generation=2, step=132, firing=(spike(),)),
    )
    alerted = advance(
        applied.status, world(applied.status, spec=edit, generation=2, scrapes=firing)
    )
    assert alerted.decision is not None
    assert (alerted.decision.action, alerted.decision.rule) == (Action.ALERT, "spike")
    assert alerted.status.phase is Phase.RUNNING
    assert alerted.delete_pods == ()


def raced_trip(generation: int) -> Any:
    report = trip("node-a", step=132, onset=129, signal="LossSpike")
    return report.model_copy(update={"directives_generation": generation})


def test_a_trip_that_raced_the_edit_is_decided_by_the_rules_that_made_the_agent_trip() -> None:
    """The pods tripped under generation 1 (LossSpike stops) before they applied the edit:
    the stop is the old policy's, a Rollback 10 steps before the onset with the data skipped,
    never a restart from the latest checkpoint next to the onset into the bad data."""
    status = launched()
    edit = edited(rules=SPIKE_ALERTS)
    sent = advance(status, world(status, spec=edit, generation=2))
    pods = tuple(pod(r, state=PodState.FAILED, report=raced_trip(1)) for r in (0, 1))
    stop = advance(sent.status, world(sent.status, spec=edit, generation=2, pods=pods))
    assert stop.decision is not None
    assert (stop.decision.action, stop.decision.rule) == (Action.ROLLBACK, "spike")
    assert stop.decision.target_step_at_most == 119
    assert stop.status.phase is Phase.STOPPING
    # The pods are gone: the edit is in force at once, and the relaunch carries it.
    planning = advance(stop.status, world(stop.status, spec=edit, generation=2, pods=()))
    assert planning.status.policy is not None
    assert planning.status.policy.spec_generation == 2
    assert [r.action for r in planning.status.policy.recovery.rules][1] is Action.ALERT
    assert planning.status.observed_generation == 2


def test_a_trip_under_the_new_generation_is_decided_by_the_new_rules() -> None:
    """Tripped after adopting the edit (the report's generation says so): the edit is in
    force for that decision even before a scrape showed every pod on it."""
    status = launched()
    fail_on_nan = [{"name": "nan", "onSignals": ["NonFinite"], "action": "Fail"}]
    edit = edited(rules=fail_on_nan)
    sent = advance(status, world(status, spec=edit, generation=2))
    assert sent.status.directives_generation == 2
    report = trip("node-a").model_copy(update={"directives_generation": 2})
    pods = tuple(pod(r, state=PodState.FAILED, report=report) for r in (0, 1))
    stop = advance(sent.status, world(sent.status, spec=edit, generation=2, pods=pods))
    assert stop.decision is not None
    assert (stop.decision.action, stop.decision.rule) == (Action.FAIL, "nan")


def test_an_edit_the_pods_do_not_apply_is_in_force_at_once() -> None:
    status = launched()
    edit = edited(budgets={"maxRollbacks": 7, "maxRestarts": 2, "cooldownSeconds": 0})
    step = advance(status, world(status, spec=edit, generation=2))
    assert step.live is None
    assert step.status.policy is not None
    assert step.status.policy.recovery.budgets.max_rollbacks == 7
    assert step.status.observed_generation == 2
    assert condition(step)[:2] == ("True", Reason.SPEC_IN_FORCE)


def test_checkpoint_settings_reach_the_pods_live() -> None:
    status = launched()
    job = spec()
    checkpoints = job.checkpoints.model_dump(by_alias=True)
    edit = spec(
        checkpoints={
            **checkpoints,
            "intervalSteps": 7,
            "pfs": {**checkpoints["pfs"], "retention": 9},
        }
    )
    step = advance(status, world(status, spec=edit, generation=2))
    assert step.live is not None
    assert step.live.checkpoints == CheckpointSettings(
        interval_steps=7, keep_local=3, keep_pfs=9, spike_markers=2
    )
    assert "checkpoint settings" in next(
        e.message for e in step.events if e.reason == Reason.AWAITING_PODS
    )


def test_a_template_edit_waits_for_the_next_attempt_and_says_so() -> None:
    status = launched()
    job = spec()
    workers = job.workers.model_dump(by_alias=True)
    workers["template"]["spec"]["containers"][0]["image"] = "trainer:v2"
    edit = spec(workers=workers)
    step = advance(status, world(status, spec=edit, generation=2))
    assert step.live is None
    assert step.status.observed_generation == 1
    ok, reason, message = condition(step)
    assert (ok, reason) == ("False", Reason.AT_NEXT_ATTEMPT)
    assert "takes effect at attempt 1; the pods of attempt 0 were built from generation 1" in (
        message
    )


def test_a_memory_tier_or_warm_start_edit_waits_for_the_next_attempt_too() -> None:
    """Both reach a pod only when it is created (its environment and volume, the supervisor's
    standby): before, the edit read as in force while the pods kept the old values."""
    status = launched()
    job = spec()
    memory = job.checkpoints.model_copy(
        update={"memory": job.checkpoints.memory.model_copy(update={"interval_steps": 0})}
    )
    cold = job.recovery.model_copy(update={"warm_start": False})
    for edit in (
        job.model_copy(update={"checkpoints": memory}),
        job.model_copy(update={"recovery": cold}),
    ):
        step = advance(status, world(status, spec=edit, generation=2))
        assert step.live is None
        assert step.status.observed_generation == 1
        ok, reason, message = condition(step)
        assert (ok, reason) == ("False", Reason.AT_NEXT_ATTEMPT)
        assert "checkpoints.memory, recovery.restart or warmStart" in message


def refused(job: StableTrainingJobSpec) -> EffectivePolicy:
    limits = StableTrainingPolicy.model_validate(
        {"metadata": {"name": "team"}, "spec": {"limits": {"maxRollbacks": 3}}}
    )
    return effective_policy(job, [limits])


def test_an_edit_beyond_a_policy_limit_is_not_taken_into_force() -> None:
    status = launched()
    edit = edited(budgets={"maxRollbacks": 50, "maxRestarts": 2, "cooldownSeconds": 0})
    target = refused(edit)
    assert target.spec is None
    step = advance(status, world(status, spec=edit, generation=2, target=target))
    assert step.live is None
    assert step.status.policy == status.policy
    assert step.status.observed_generation == 1
    ok, reason, message = condition(step)
    assert (ok, reason) == ("False", Reason.EXCEEDS_POLICY_LIMIT)
    assert message == (
        "spec generation 2 is not in force: recovery.budgets.maxRollbacks 50 is above "
        "limits.maxRollbacks 3 of StableTrainingPolicy/team; the pods and the operator keep "
        "the policy of generation 1"
    )
    assert [(e.type, e.reason) for e in step.events] == [("Warning", "ExceedsPolicyLimit")]


def test_a_new_job_beyond_a_limit_starts_no_pod() -> None:
    job = edited(budgets={"maxRollbacks": 50, "maxRestarts": 2, "cooldownSeconds": 0})
    fresh = StableTrainingJobStatus()
    step = advance(fresh, world(fresh, spec=job, pods=(), target=refused(job)))
    assert step.launch is None
    assert step.status.phase is Phase.PENDING
    assert step.status.policy is None
    ok, reason, message = condition(step)
    assert (ok, reason) == ("False", Reason.EXCEEDS_POLICY_LIMIT)
    assert message.endswith("; no pod is started")


def test_a_reverted_edit_is_sent_again_so_the_pods_run_what_is_in_force() -> None:
    status = launched()
    sent = advance(status, world(status, spec=edited(rules=SPIKE_ALERTS), generation=2))
    back = advance(sent.status, world(sent.status, spec=spec(), generation=3))
    assert back.live is not None, "the pods may have taken generation 2 meanwhile"
    assert back.live.generation == 3
    assert "LossSpike" in back.live.trip_on
    assert back.status.policy_rollout is not None
    assert back.status.policy_rollout.policy.spec_generation == 3
