"""A job's effective policy: its own values, then its StableTrainingPolicy defaults, then the
built-in ones; held to the policies' limits; with where each value came from.

Pure: the operator passes the job's spec (as written: the CRD keeps no defaults in
`detection` and `recovery`, so what the job left out is absent) and the policies selecting
its namespace, highest priority first. Each field a job leaves out comes from the first of
those policies that sets it, else from the built-in default; a list (`recovery.rules`,
`detection.custom`) is taken whole from one source. A limit refuses a value the job itself
set beyond it (the message names the limit and the policy), and holds an inherited value
to it (the source says so).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from stabletrain_contract.base import error_lines
from stabletrain_contract.names import Action
from stabletrain_operator.api.cluster_policy import PolicyLimits, StableTrainingPolicy
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.policy_in_force import SOURCE_JOB, PolicySource
from stabletrain_operator.api.spec import ReduceLRParams, RollbackParams, StableTrainingJobSpec

INHERITED = ("detection", "recovery")
"""The spec fields a StableTrainingPolicy's defaults fill in."""
Json = dict[str, Any]


@dataclass(frozen=True)
class EffectivePolicy:
    """The spec a job runs under its namespace's policies, or why it may not run."""

    spec: StableTrainingJobSpec | None
    """The job's spec with the inherited values; None when refused."""
    policies: tuple[str, ...] = ()
    sources: tuple[PolicySource, ...] = ()
    reason: Reason | None = None
    """ExceedsPolicyLimit or InvalidEffectivePolicy when refused."""
    refusal: str = ""
    """What is wrong, naming the field, the limit and the policy."""


def policy_source(policy: StableTrainingPolicy) -> str:
    return f"StableTrainingPolicy/{policy.name}"


def effective_policy(
    spec: StableTrainingJobSpec, policies: Sequence[StableTrainingPolicy]
) -> EffectivePolicy:
    """`spec` under `policies` (highest priority first), refused or with every inherited
    value and its source."""
    written = spec.model_dump(by_alias=True, exclude_unset=True, mode="json")
    merged: Json = {}
    origin: dict[str, str] = {}
    layers = [(policy_source(p), _defaults(p)) for p in reversed(policies)]
    layers.append((SOURCE_JOB, {k: written[k] for k in INHERITED if k in written}))
    for source, layer in layers:
        _merge(merged, layer, source, origin, "")
    names = tuple(p.name for p in policies)
    body = {**written, **merged}
    parsed = _validated(body)
    if isinstance(parsed, str):
        return EffectivePolicy(None, names, reason=Reason.INVALID_EFFECTIVE_POLICY, refusal=parsed)
    refusals: list[str] = []
    for policy in policies:
        for check in _LIMIT_CHECKS:
            refusals += check(parsed, policy.spec.limits, policy_source(policy), body, origin)
        parsed_again = _validated(body)
        assert not isinstance(parsed_again, str), parsed_again  # a clamp stays within bounds
        parsed = parsed_again
    if body == written and parsed == spec:
        # Nothing inherited changed a value: the job's own spec object serves, instead of
        # a second copy of it held for every job (about 22 KiB each, bench/operator_scale.py).
        parsed = spec
    sources = _sources(origin)
    if refusals:
        return EffectivePolicy(
            None,
            names,
            sources,
            Reason.EXCEEDS_POLICY_LIMIT,
            "; ".join(refusals),
        )
    return EffectivePolicy(parsed, names, sources)


def _defaults(policy: StableTrainingPolicy) -> Json:
    dumped: Json = policy.spec.defaults.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return {key: value for key, value in dumped.items() if value is not None}


def _merge(into: Json, layer: Json, source: str, origin: dict[str, str], prefix: str) -> None:
    """Deep-merge `layer` over `into` (lists are replaced whole), recording each leaf's
    source in `origin` by its dotted spec path."""
    for key, value in layer.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value, source, origin, path + ".")
            continue
        into[key] = copy.deepcopy(value)
        for stale in [p for p in origin if p == path or p.startswith(path + ".")]:
            del origin[stale]
        for leaf in _leaves(value, path):
            origin[leaf] = source


def _leaves(value: Any, path: str) -> list[str]:
    if isinstance(value, dict) and value:
        return [leaf for key, child in value.items() for leaf in _leaves(child, f"{path}.{key}")]
    return [path]


def _validated(body: Json) -> StableTrainingJobSpec | str:
    try:
        return StableTrainingJobSpec.model_validate(body)
    except ValidationError as error:
        lines = error_lines(error)
        return "the effective policy (the job's values over its policies' defaults) is " + (
            "invalid: " + "; ".join(lines)
        )


def _sources(origin: dict[str, str]) -> tuple[PolicySource, ...]:
    by_source: dict[str, list[str]] = {}
    for path, source in sorted(origin.items()):
        by_source.setdefault(source, []).append(path)
    ordered = sorted(by_source.items(), key=lambda item: (item[0] != SOURCE_JOB, item[0]))
    return tuple(PolicySource(source=s, fields=tuple(f)) for s, f in ordered)


def _set(body: Json, path: str, value: Any) -> None:
    """Write `value` at the dotted path, creating the objects on the way."""
    *parents, leaf = path.split(".")
    node = body
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


LimitCheck = Callable[[StableTrainingJobSpec, PolicyLimits, str, Json, dict[str, str]], list[str]]


def _bounded(
    path: str,
    value: float | None,
    bound: float | None,
    *,
    above: bool,
    limit: str,
    source: str,
    body: Json,
    origin: dict[str, str],
) -> list[str]:
    """One numeric field against one limit: refused if the job set it beyond, else held."""
    if value is None or bound is None:
        return []
    beyond = value > bound if above else value < bound
    if not beyond:
        return []
    if origin.get(path) == SOURCE_JOB:
        side = "above" if above else "below"
        return [f"{path} {value:g} is {side} limits.{limit} {bound:g} of {source}"]
    _set(body, path, bound)
    origin[path] = f"{source} limits.{limit}"
    return []


def _budgets(
    spec: StableTrainingJobSpec,
    limits: PolicyLimits,
    source: str,
    body: Json,
    origin: dict[str, str],
) -> list[str]:
    budgets = spec.recovery.budgets
    found: list[str] = []
    for path, value, bound, limit in (
        ("recovery.budgets.maxRollbacks", budgets.max_rollbacks, limits.max_rollbacks,
         "maxRollbacks"),
        ("recovery.budgets.maxRestarts", budgets.max_restarts, limits.max_restarts, "maxRestarts"),
    ):  # fmt: skip
        found += _bounded(path, value, bound, above=True, limit=limit, source=source, body=body,
                          origin=origin)  # fmt: skip
    return found


def _spike_thresholds(
    spec: StableTrainingJobSpec,
    limits: PolicyLimits,
    source: str,
    body: Json,
    origin: dict[str, str],
) -> list[str]:
    found: list[str] = []
    for name in ("lossSpike", "gradNormSpike"):
        config = (
            spec.detection.loss_spike if name == "lossSpike" else spec.detection.grad_norm_spike
        )
        for field, value, bound, limit in (
            ("ratio", config.ratio, limits.min_spike_ratio, "minSpikeRatio"),
            ("zscore", config.zscore, limits.min_spike_zscore, "minSpikeZscore"),
        ):
            found += _bounded(f"detection.{name}.{field}", value, bound, above=False, limit=limit,
                              source=source, body=body, origin=origin)  # fmt: skip
    return found


def _lr_floors(
    spec: StableTrainingJobSpec,
    limits: PolicyLimits,
    source: str,
    body: Json,
    origin: dict[str, str],
) -> list[str]:
    """Each Rollback and ReduceLR rule's lrFloor: refused when the job's own rules write one
    below the limit, held to it otherwise (a floor nobody wrote, or one a policy's default
    rules wrote)."""
    bound = limits.min_lr_floor
    if bound is None:
        return []
    rules_from_job = origin.get("recovery.rules") == SOURCE_JOB
    rules = [rule.model_dump(by_alias=True, exclude_unset=True, mode="json")
             for rule in spec.recovery.rules]  # fmt: skip
    found: list[str] = []
    held = False
    for rule, written in zip(spec.recovery.rules, rules, strict=True):
        params: RollbackParams | ReduceLRParams | None
        if rule.action is Action.ROLLBACK:
            key, params, floor = "rollback", rule.rollback, rule.rollback_params().lr_floor
        elif rule.action is Action.REDUCE_LR:
            key, params, floor = "reduceLR", rule.reduce_lr, rule.reduce_lr_params().lr_floor
        else:
            continue
        if floor >= bound:
            continue
        if rules_from_job and params is not None and "lr_floor" in params.model_fields_set:
            found.append(
                f"rule {rule.name}'s {key}.lrFloor {floor:g} is below limits.minLrFloor "
                f"{bound:g} of {source}"
            )
            continue
        written.setdefault(key, {})["lrFloor"] = bound
        held = True
    if held and not found:
        _set(body, "recovery.rules", rules)
        if not rules_from_job:
            origin["recovery.rules"] = f"{source} limits.minLrFloor"
    return found


def _actions(
    spec: StableTrainingJobSpec,
    limits: PolicyLimits,
    source: str,
    body: Json,
    origin: dict[str, str],
) -> list[str]:
    allowed = limits.allowed_actions
    if allowed is None:
        return []
    rules_from = origin.get("recovery.rules", "the built-in default")
    final_from = origin.get("recovery.escalation.finalAction", "the built-in default")
    used = [(f"rule {r.name}'s action ({rules_from})", r.action) for r in spec.recovery.rules]
    used.append((f"escalation.finalAction ({final_from})", spec.recovery.escalation.final_action))
    bad = [f"{what} {action.value}" for what, action in used if action not in allowed]
    if not bad:
        return []
    return [
        f"{', '.join(bad)} not in limits.allowedActions "
        f"[{', '.join(a.value for a in allowed)}] of {source}"
    ]


_LIMIT_CHECKS: tuple[LimitCheck, ...] = (_budgets, _spike_thresholds, _lr_floors, _actions)
