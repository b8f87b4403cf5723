"""A job's effective policy under its namespace's StableTrainingPolicy objects: which
policies select the namespace, what a job inherits and from whom, and what a limit refuses
or holds."""

from __future__ import annotations

from typing import Any

import pytest

from stabletrain_contract.base import AS_WRITTEN
from stabletrain_contract.names import Action
from stabletrain_operator.api.cluster_policy import StableTrainingPolicy
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.platform_policy.effective import effective_policy
from stabletrain_operator.platform_policy.label_selection import applicable, selects

WORKERS = {"template": {"spec": {"containers": [{"name": "t", "command": ["torchrun"]}]}}}
CHECKPOINTS = {"local": {"hostPath": "/nvme"}, "pfs": {"claimName": "pfs"}}


def job(**fields: Any) -> StableTrainingJobSpec:
    """A spec as the API server stores it: only what the job wrote (no inherited defaults)."""
    return StableTrainingJobSpec.model_validate(
        {"workers": WORKERS, "checkpoints": CHECKPOINTS, **fields}, context={AS_WRITTEN: True}
    )


def policy(name: str, *, priority: int = 0, selector: Any = None, **spec: Any) -> Any:
    body: dict[str, Any] = {"priority": priority, **spec}
    if selector is not None:
        body["namespaceSelector"] = selector
    return StableTrainingPolicy.model_validate({"metadata": {"name": name}, "spec": body})


PLATFORM = policy(
    "platform",
    defaults={
        "recovery": {"budgets": {"maxRollbacks": 2}, "escalation": {"maxRecurrences": 1}},
        "detection": {"lossSpike": {"ratio": 2.0}},
    },
    limits={"maxRollbacks": 3, "minLrFloor": 0.1, "minSpikeRatio": 1.5, "minSpikeZscore": 3.0},
)


def sources(result: Any) -> dict[str, tuple[str, ...]]:
    return {s.source: s.fields for s in result.sources}


def test_a_job_that_sets_nothing_inherits_the_policy_and_the_built_in_rest() -> None:
    result = effective_policy(job(), [PLATFORM])
    assert result.refusal == ""
    assert result.spec is not None
    assert result.spec.recovery.budgets.max_rollbacks == 2
    assert result.spec.recovery.budgets.max_restarts == 10, "built-in default"
    assert result.spec.recovery.escalation.max_recurrences == 1
    assert result.spec.detection.loss_spike.ratio == 2.0
    assert result.spec.detection.loss_spike.consecutive_steps == 4, "merged field by field"
    assert result.policies == ("platform",)
    # The built-in rules' lrFloor 0.05 is below the limit: nobody wrote it, so it is held.
    assert {r.rollback_params().lr_floor for r in result.spec.recovery.rules
            if r.action is Action.ROLLBACK} == {0.1}  # fmt: skip
    assert sources(result) == {
        "StableTrainingPolicy/platform": (
            "detection.lossSpike.ratio",
            "recovery.budgets.maxRollbacks",
            "recovery.escalation.maxRecurrences",
        ),
        "StableTrainingPolicy/platform limits.minLrFloor": ("recovery.rules",),
    }


def test_a_job_s_own_value_within_the_limits_is_kept_and_named_as_its_own() -> None:
    result = effective_policy(job(recovery={"budgets": {"maxRollbacks": 3}}), [PLATFORM])
    assert result.spec is not None
    assert result.spec.recovery.budgets.max_rollbacks == 3
    assert sources(result)["Job"] == ("recovery.budgets.maxRollbacks",)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"recovery": {"budgets": {"maxRollbacks": 10}}},
            "recovery.budgets.maxRollbacks 10 is above limits.maxRollbacks 3 of "
            "StableTrainingPolicy/platform",
        ),
        (
            {"detection": {"lossSpike": {"ratio": 1.2}}},
            "detection.lossSpike.ratio 1.2 is below limits.minSpikeRatio 1.5 of "
            "StableTrainingPolicy/platform",
        ),
        (
            {"detection": {"gradNormSpike": {"zscore": 2.0}}},
            "detection.gradNormSpike.zscore 2 is below limits.minSpikeZscore 3 of "
            "StableTrainingPolicy/platform",
        ),
        (
            {"recovery": {"rules": [{"name": "s", "onSignals": ["LossSpike"],
                                     "action": "Rollback", "rollback": {"lrFloor": 0.01}}]}},
            "rule s's rollback.lrFloor 0.01 is below limits.minLrFloor 0.1 of "
            "StableTrainingPolicy/platform",
        ),
    ],
    ids=["budget", "ratio", "zscore", "lr-floor"],
)  # fmt: skip
def test_a_value_the_job_sets_beyond_a_limit_is_refused_naming_the_limit(
    fields: dict[str, Any], message: str
) -> None:
    result = effective_policy(job(**fields), [PLATFORM])
    assert result.spec is None
    assert (result.reason, result.refusal) == (Reason.EXCEEDS_POLICY_LIMIT, message)


def test_actions_a_policy_does_not_allow_are_refused_wherever_the_rules_come_from() -> None:
    no_fail = policy("no-fail", limits={"allowedActions": ["Rollback", "RestartFromLatest",
                                                           "Alert"]})  # fmt: skip
    result = effective_policy(job(), [no_fail])
    assert result.spec is None
    assert result.refusal == (
        "escalation.finalAction (the built-in default) Fail not in limits.allowedActions "
        "[Rollback, RestartFromLatest, Alert] of StableTrainingPolicy/no-fail"
    )
    alert_at_the_end = job(recovery={"escalation": {"finalAction": "Alert"}})
    assert effective_policy(alert_at_the_end, [no_fail]).spec is not None


def test_a_policy_may_allow_every_action_by_name() -> None:
    """The list's bound follows the actions there are: a new action cannot make a policy
    that names them all invalid."""
    every = policy("every", limits={"allowedActions": [a.value for a in Action]})
    assert every.spec.limits.allowed_actions == tuple(Action)
    assert effective_policy(job(), [every]).spec is not None


def test_the_highest_priority_policy_gives_each_default_and_every_limit_applies() -> None:
    team = policy("team", priority=10, defaults={"recovery": {"budgets": {"maxRollbacks": 1}}},
                  limits={"maxRestarts": 4})  # fmt: skip
    result = effective_policy(job(), [team, PLATFORM])
    assert result.spec is not None
    assert result.spec.recovery.budgets.max_rollbacks == 1, "team outranks platform"
    assert result.spec.recovery.escalation.max_recurrences == 1, "platform's, team sets none"
    assert result.spec.recovery.budgets.max_restarts == 4, "the built-in 10, held to team's"
    assert sources(result)["StableTrainingPolicy/team limits.maxRestarts"] == (
        "recovery.budgets.maxRestarts",
    )
    assert result.policies == ("team", "platform")


def test_an_effective_policy_that_does_not_validate_is_refused_with_the_field() -> None:
    zscore = policy("z", defaults={"detection": {"lossSpike": {"zscore": 6.0}}})
    result = effective_policy(job(detection={"lossSpike": {"consecutiveSteps": 8}}), [zscore])
    assert result.spec is not None
    spike = result.spec.detection.loss_spike
    assert (spike.ratio, spike.zscore, spike.consecutive_steps) == (1.6, 6.0, 8)
    disabled = effective_policy(job(detection={"lossSpike": {"ratio": None}}), [])
    assert disabled.reason is Reason.INVALID_EFFECTIVE_POLICY
    assert "detection.lossSpike" in disabled.refusal
    assert "set ratio, zscore or both" in disabled.refusal
    assert effective_policy(job(detection={"lossSpike": {"ratio": None}}), [zscore]).spec, (
        "the policy's zscore keeps a rule when the job disables the ratio"
    )
    rules = {"rules": [{"name": "e", "onSignals": ["custom:entropy"], "action": "Alert"}]}
    undefined = effective_policy(job(recovery=rules), [])
    assert undefined.spec is None
    assert undefined.reason is Reason.INVALID_EFFECTIVE_POLICY
    assert "custom:entropy, which detection.custom does not define" in undefined.refusal
    custom = {"custom": [{"name": "entropy", "kind": "Below", "threshold": 1.0}]}
    defined = policy("custom", defaults={"detection": custom})
    assert effective_policy(job(recovery=rules), [defined]).spec is not None


def test_namespace_selectors_as_kubernetes_evaluates_them() -> None:
    labels = {"team": "vision", "kubernetes.io/metadata.name": "vision-prod", "tier": "prod"}
    assert selects(None, labels)
    everything = policy("all", selector={}).spec.namespace_selector
    assert selects(everything, {})
    vision = policy("v", selector={"matchLabels": {"team": "vision"}}).spec.namespace_selector
    assert selects(vision, labels)
    assert not selects(vision, {"team": "nlp"})
    exprs = policy("e", selector={"matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["prod", "staging"]},
        {"key": "sandbox", "operator": "DoesNotExist"},
    ]}).spec.namespace_selector  # fmt: skip
    assert selects(exprs, labels)
    assert not selects(exprs, {**labels, "sandbox": "yes"})
    assert not selects(exprs, {"tier": "dev"})
    not_in = policy("n", selector={"matchExpressions": [
        {"key": "tier", "operator": "NotIn", "values": ["prod"]},
        {"key": "team", "operator": "Exists"},
    ]}).spec.namespace_selector  # fmt: skip
    assert not selects(not_in, labels)
    assert selects(not_in, {"team": "x"})
    chosen = applicable([PLATFORM, policy("z", priority=5), policy("a", priority=5)], labels)
    assert [p.name for p in chosen] == ["a", "z", "platform"]


def test_a_spec_no_policy_changes_is_the_same_object_and_a_changed_one_is_a_copy() -> None:
    # Held for every job of the operator: a copy of an unchanged spec doubled its memory.
    written = job(recovery={"budgets": {"maxRollbacks": 3}})
    assert effective_policy(written, []).spec is written
    inherited = effective_policy(written, [PLATFORM]).spec
    assert inherited is not None
    assert inherited is not written
    assert inherited.detection.loss_spike.ratio == 2.0
    assert written.detection.loss_spike.ratio != 2.0, "the job's own spec is left as written"
