"""The API server accepts every pod a relaunch builds away from suspect nodes, however many.

Found by the chaos fault injection (tests/e2e/test_fault_injection.py): after a killed rank
and a hung rank the job had two suspect nodes, the relaunch put both into one
`metadata.name NotIn` requirement, the API server refuses more than one value there (422
Unprocessable Entity), and the job stayed in Relaunching for good, retrying.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from stabletrain_operator import pods
from stabletrain_operator.api.spec import StableTrainingJobSpec
from support.operator import job_manifest

JOB = pods.JobRef("gpt", "team", "uid-1")


@pytest.mark.parametrize("required", [False, True], ids=["preferred", "required"])
@pytest.mark.parametrize("suspects", [1, 2, 3])
def test_a_relaunch_away_from_suspect_nodes_is_a_pod_the_api_server_accepts(
    api_client: client.ApiClient, pod_namespace: str, required: bool, suspects: int
) -> None:
    spec = StableTrainingJobSpec.model_validate(job_manifest("gpt", {})["spec"])
    avoid = ("node-a", "node-b", "node-c")[:suspects]
    pod = pods.build_pod(spec, JOB, 3, 1, "node-b", avoid_nodes=avoid, avoid_required=required)
    pod["metadata"]["namespace"] = pod_namespace
    pod["metadata"].pop("ownerReferences", None)
    core = client.CoreV1Api(api_client)
    created = core.create_namespaced_pod(pod_namespace, pod, dry_run="All")
    affinity = created.spec.affinity.node_affinity
    terms = (
        affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
        if required
        else [p.preference for p in affinity.preferred_during_scheduling_ignored_during_execution]
    )
    away = [f.values for t in terms for f in t.match_fields or [] if f.operator == "NotIn"]
    assert sorted(v for values in away for v in values) == sorted(avoid)
