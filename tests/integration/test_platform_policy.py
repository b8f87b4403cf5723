"""A platform team's StableTrainingPolicy on the real control plane with the operator running:
a job that sets nothing inherits its defaults, a job's own value within the limits is kept, one
beyond a limit is refused with the limit named, status.policy shows the effective policy and
where each value came from, and an edit of the policy reaches the jobs that inherit from it.

The policy selects only this test's namespace (by its `kubernetes.io/metadata.name` label):
policies are cluster-scoped, and other tests share the control plane. The jobs are created
suspended where they need not run, so no pod starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from stabletrain_operator.api.cluster_policy import POLICY_KIND, POLICY_PLURAL
from stabletrain_operator.api.constants import API_VERSION, GROUP, VERSION
from support.operator import Jobs, OperatorProcess, job_manifest

LIMIT = "limits.maxRollbacks 3"


@pytest.fixture
def platform_policy(api_client: client.ApiClient, job_namespace: str) -> Iterator[str]:
    """Created before the operator starts (it lists policies before serving any job)."""
    custom: Any = client.CustomObjectsApi(api_client)
    name = f"platform-{job_namespace}"
    body = {
        "apiVersion": API_VERSION,
        "kind": POLICY_KIND,
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": job_namespace}},
            "defaults": {
                "recovery": {"budgets": {"maxRollbacks": 2}, "escalation": {"maxRecurrences": 1}},
                "detection": {"lossSpike": {"ratio": 2.0}},
            },
            "limits": {"maxRollbacks": 3, "minLrFloor": 0.1},
        },
    }
    custom.create_cluster_custom_object(GROUP, VERSION, POLICY_PLURAL, body)
    try:
        yield name
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, POLICY_PLURAL, name)


def spec_applied(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == "SpecApplied"), {})


def sources(status: dict[str, Any]) -> dict[str, list[str]]:
    return {s["source"]: s["fields"] for s in status["policy"]["sources"]}


def test_namespace_defaults_are_inherited_overrides_within_limits_kept_beyond_refused(
    platform_policy: str, operator: OperatorProcess, jobs: Jobs, api_client: client.ApiClient
) -> None:
    started = time.monotonic()
    source = f"StableTrainingPolicy/{platform_policy}"
    inherits = job_manifest("inherits", {})
    inherits["spec"]["suspend"] = True
    jobs.create(inherits)
    within = job_manifest("within", {}, recovery={"budgets": {"maxRollbacks": 3}})
    within["spec"]["suspend"] = True
    jobs.create(within)
    beyond = job_manifest("beyond", {}, recovery={"budgets": {"maxRollbacks": 10}})
    jobs.create(beyond)

    inherited = jobs.wait("inherits", lambda s: s.get("policy") is not None, 60, "its policy")
    policy = inherited["policy"]
    assert policy["policies"] == [platform_policy]
    assert policy["recovery"]["budgets"]["maxRollbacks"] == 2, "the namespace's default"
    assert policy["recovery"]["budgets"]["maxRestarts"] == 10, "the built-in default"
    assert policy["recovery"]["escalation"]["maxRecurrences"] == 1
    assert policy["detection"]["lossSpike"]["ratio"] == 2.0
    assert policy["detection"]["lossSpike"]["consecutiveSteps"] == 4
    assert {r["rollback"]["lrFloor"] for r in policy["recovery"]["rules"] if "rollback" in r} == {
        0.1
    }, "the built-in floor 0.05 held to the limit"
    inherited_sources = sources(inherited)
    assert inherited_sources[source] == [
        "detection.lossSpike.ratio",
        "recovery.budgets.maxRollbacks",
        "recovery.escalation.maxRecurrences",
    ]
    assert inherited_sources[f"{source} limits.minLrFloor"] == ["recovery.rules"]
    assert spec_applied(inherited)["status"] == "True"
    assert inherited["observedGeneration"] == 1

    kept = jobs.wait("within", lambda s: s.get("policy") is not None, 60, "its policy")
    assert kept["policy"]["recovery"]["budgets"]["maxRollbacks"] == 3
    assert "recovery.budgets.maxRollbacks" in sources(kept)["Job"]

    refused = jobs.wait("beyond", lambda s: spec_applied(s).get("status") == "False", 60,
                        "the refusal")  # fmt: skip
    condition = spec_applied(refused)
    assert condition["reason"] == "ExceedsPolicyLimit"
    assert f"recovery.budgets.maxRollbacks 10 is above {LIMIT} of {source}" in condition["message"]
    assert refused.get("phase", "Pending") == "Pending"
    assert "policy" not in refused or refused["policy"] is None
    assert jobs.pods("beyond") == [], "a refused job starts no pod"
    warnings = [e for e in jobs.events("beyond") if e["reason"] == "ExceedsPolicyLimit"]
    assert [e["type"] for e in warnings] == ["Warning"]
    assert LIMIT in warnings[0]["message"]

    # The platform team lowers its default: the job that inherits it follows, the job that
    # set its own value does not.
    custom: Any = client.CustomObjectsApi(api_client)
    custom.patch_cluster_custom_object(
        GROUP, VERSION, POLICY_PLURAL, platform_policy,
        {"spec": {"defaults": {"recovery": {"budgets": {"maxRollbacks": 1}}}}},
    )  # fmt: skip
    edited_at = time.monotonic()
    lowered = jobs.wait(
        "inherits", lambda s: s["policy"]["recovery"]["budgets"]["maxRollbacks"] == 1, 60,
        "the policy's new default to reach the job",
    )  # fmt: skip
    reached = time.monotonic() - edited_at
    assert jobs.status("within")["policy"]["recovery"]["budgets"]["maxRollbacks"] == 3
    assert lowered["observedGeneration"] == 1, "the job's spec did not change"
    print(f"\nstatus.policy of 'inherits': {lowered['policy']['sources']}")
    print(f"refused: {condition['message']}")
    print(
        f"policy edit reached the job in {reached:.1f} s; test {time.monotonic() - started:.0f} s"
    )
