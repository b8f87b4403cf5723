"""Everything that keeps a spec from becoming pods, found before any pod exists.

The CRD's schema and CEL rules refuse what they can at `kubectl apply`; what they cannot
(the cluster's own limits, the open pod template, names that outgrow a hostname only at a
high attempt) is found here, each problem naming its field, in this order:

1. the job's name (hostnames.py),
2. the node-local tier against the cluster's node directories and volume types
   (local_tier.py),
3. the shape of the template fields the operator fills in (template_shape.py),
4. the template against the cluster's Pod Security level (pod_security.py),
5. the operator's own pod built from it (the last rank's, with the longest name),
6. that pod sent to the API server as a dry run: validation and admission (the namespace's
   Pod Security, quotas' validation, webhooks) answer without anything being created.

The reconcile runs this once per spec generation and attempt to launch (SpecGate) and
holds the job with the InvalidSpec condition while a problem stands; the API server is
asked at most once per generation and attempt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from stabletrain_operator import pods
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.apiserver import ApiError
from stabletrain_operator.kube import Kube
from stabletrain_operator.tenancy import pod_security
from stabletrain_operator.tenancy.hostnames import name_problems
from stabletrain_operator.tenancy.limits import TenancySettings
from stabletrain_operator.tenancy.local_tier import local_tier_problems
from stabletrain_operator.tenancy.problems import SpecProblem
from stabletrain_operator.tenancy.template_shape import shape_problems

TEMPLATE = "spec.workers.template"
POD_SECURITY_DENIAL = "violates PodSecurity"
"""How the API server's PodSecurity admission words its 403 (a quota's 403 is transient)."""
Json = dict[str, Any]


@dataclass(frozen=True)
class Checked:
    problems: tuple[SpecProblem, ...]
    pod: Json | None
    """The attempt's last pod as the operator would create it (None when it cannot)."""


def spec_problems(
    spec: StableTrainingJobSpec,
    job: pods.JobRef,
    settings: TenancySettings,
    *,
    attempt: int,
    preflight_generation: int | None = None,
) -> Checked:
    """Steps 1-5 (no API call)."""
    problems = name_problems(
        job.name,
        nodes=spec.workers.nodes,
        attempt=attempt,
        preflight_generation=preflight_generation,
    )
    problems += local_tier_problems(spec.checkpoints.local, settings)
    shape = shape_problems(spec.workers)
    if shape:
        return Checked((*problems, *shape), None)
    level = settings.pod_security
    problems += [
        SpecProblem(
            f"{TEMPLATE}.{found.field}",
            Reason.POD_SECURITY,
            f"{found.message} (the cluster requires the {level} Pod Security level)",
        )
        for found in pod_security.violations(spec.workers.template, level)
    ]
    try:
        pod = pods.build_pod(spec, job, attempt, spec.workers.nodes - 1)
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        message = f"the operator cannot make a pod of it: {type(error).__name__}: {error}"
        return Checked((*problems, SpecProblem(TEMPLATE, Reason.MALFORMED_TEMPLATE, message)), None)
    return Checked(tuple(problems), pod)


def refuses_spec(error: ApiError) -> bool:
    """Whether the API server's answer to a pod is about the pod itself (invalid, or
    denied by Pod Security admission), not a passing condition (quota, throttling, RBAC)."""
    if error.status in (HTTPStatus.BAD_REQUEST, HTTPStatus.UNPROCESSABLE_ENTITY):
        return True
    return error.status == HTTPStatus.FORBIDDEN and POD_SECURITY_DENIAL in str(error.body)


def api_refusal(error: ApiError) -> SpecProblem:
    """The API server's own words (they name the pod's field) as the template's problem."""
    text = str(error.body or error.reason)
    try:
        status = json.loads(text)
    except ValueError:
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        text = status["message"]
    return SpecProblem(
        TEMPLATE, Reason.REFUSED_BY_API_SERVER, f"the API server refuses the pods it makes: {text}"
    )


@dataclass
class SpecGate:
    """The verdict on one spec generation and attempt, kept by the job's daemon so the
    checks (and the dry run) run once for each."""

    key: tuple[int | None, int, int | None] | None = None
    problems: tuple[SpecProblem, ...] = ()

    def check(
        self,
        kube: Kube,
        spec: StableTrainingJobSpec,
        job: pods.JobRef,
        settings: TenancySettings,
        *,
        generation: int | None,
        attempt: int,
        preflight_generation: int | None = None,
    ) -> tuple[SpecProblem, ...]:
        """The problems of this generation and attempt; steps 1-6 the first time asked."""
        key = (generation, attempt, preflight_generation)
        if self.key == key:
            return self.problems
        checked = spec_problems(
            spec, job, settings, attempt=attempt, preflight_generation=preflight_generation
        )
        problems = checked.problems
        if not problems and checked.pod is not None:
            refusal = kube.dry_run_create(checked.pod)
            if refusal is not None and not refuses_spec(refusal):
                raise refusal
            if refusal is not None:
                problems = (api_refusal(refusal),)
        self.key, self.problems = key, problems
        return problems

    def passed(self, generation: int | None) -> bool:
        """Whether this generation of the spec passed the checks (for an attempt or the
        preflight pod): the InvalidSpec of an earlier one no longer stands."""
        return self.key is not None and self.key[0] == generation and not self.problems

    def refused(self, generation: int | None, attempt: int, problem: SpecProblem) -> None:
        """The API server refused a create the checks let through: remember it for this
        generation and attempt, so the job waits for a new spec instead of retrying."""
        self.key, self.problems = (generation, attempt, None), (problem,)
