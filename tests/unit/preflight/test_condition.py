"""The Preflight condition in the state machine: from the running pods' report (Warn), and
the Refuse-mode gate that keeps worker pods from being created; the preflight pod itself."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from test_checklist import clean_facts, job_spec

from stabletrain_contract.channel import AgentStatus
from stabletrain_operator import naming, pods
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.conditions.preflight_condition import PodOutcome, PreflightPodResult
from stabletrain_operator.machine import Transition, World, advance
from stabletrain_operator.observe.pod_facts import pod_facts
from stabletrain_operator.observe.scrape import ScrapeResult
from stabletrain_operator.preflight.preflight_pod import (
    PREFLIGHT_LABEL,
    build_preflight_pod,
    read_preflight_pod,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
REFUSE = {"mode": "Refuse"}


def world(spec: StableTrainingJobSpec, **changes: Any) -> World:
    base: dict[str, Any] = {"now": T0, "job": "job", "spec": spec, "generation": 1, "pods": ()}
    base.update(changes)
    return World(**base)


def scrape(facts: Any, rank: int = 0, attempt: int = 0) -> ScrapeResult:
    status = AgentStatus(
        attempt=attempt, node=f"node-{rank}", node_rank=rank, updated_at=T0, step=5,
        lr_scale=1.0, applied_generation=1, preflight=facts,
    )  # fmt: skip
    return ScrapeResult(pod=f"job-a{attempt}-{rank}", status=status)


def preflight(step: Transition) -> tuple[str, str, str] | None:
    found = next((c for c in step.status.conditions if c.type == "Preflight"), None)
    return None if found is None else (found.status, found.reason, found.message)


def running() -> StableTrainingJobStatus:
    return StableTrainingJobStatus(phase=Phase.RUNNING, attempt=0, directives_generation=1)


def test_warn_mode_sets_the_condition_from_the_running_pods_and_posts_one_event() -> None:
    spec = job_spec()
    facts = clean_facts(max_grad_norm=None, data_shards=None)
    first = advance(running(), world(spec, scrapes=(scrape(facts), scrape(facts, rank=1))))
    status, reason, message = preflight(first) or ("", "", "")
    assert (status, reason) == ("False", "PreflightSevereFindings")
    assert message.splitlines() == [
        "Severe: no-clipping: gradients are not clipped, so one bad batch can move the weights "
        "arbitrarily far; fix: pass max_grad_norm=1.0 to the Guard (GPT-3, OPT, LLaMA clip the "
        "global norm at 1.0)",
        "Warning: no-data-skipping: the Guard has no ShardedBatches data helper, so a rollback "
        "can rewind and lower the LR but cannot skip the data around the onset; fix: feed "
        "batches through stabletrain_agent.data.ShardedBatches and pass it as data=",
    ]
    assert [(e.type, e.reason) for e in first.events] == [("Warning", "PreflightSevereFindings")]
    assert first.status.phase is Phase.RUNNING, "Warn mode never stops a run"

    again = advance(first.status, world(spec, scrapes=(scrape(facts),)))
    assert preflight(again) == preflight(first)
    assert again.events == (), "the same facts again post no second Event"
    quiet = advance(again.status, world(spec))
    assert preflight(quiet) == preflight(first), "a tick without scrapes keeps the condition"


def test_clean_facts_pass_and_warnings_alone_keep_the_condition_true() -> None:
    spec = job_spec()
    passed = advance(running(), world(spec, scrapes=(scrape(clean_facts()),)))
    assert preflight(passed) == (
        "True",
        "PreflightPassed",
        "no finding: every preflight check passed",
    )
    warned = advance(running(), world(spec, scrapes=(scrape(clean_facts(warmup_steps=0)),)))
    assert (preflight(warned) or ("",))[:2] == ("True", "PreflightWarnings")
    stale = advance(running(), world(spec, scrapes=(scrape(clean_facts(), attempt=3),)))
    assert preflight(stale) is None, "another attempt's report is not this run's"


def test_refuse_mode_creates_no_worker_pod_until_the_preflight_passes() -> None:
    spec = job_spec(preflight=REFUSE)
    pending = StableTrainingJobStatus()
    waiting = advance(pending, world(spec, preflight_pod=None))
    assert waiting.launch is None
    assert waiting.status.phase is Phase.PENDING
    assert (preflight(waiting) or ("",))[:2] == ("False", "PreflightRunning")

    bad = PreflightPodResult(
        "job-preflight-g1", PodOutcome.FACTS, facts=clean_facts(max_grad_norm=None)
    )
    refused = advance(waiting.status, world(spec, preflight_pod=bad))
    assert refused.launch is None
    assert refused.status.phase is Phase.PENDING
    status, reason, message = preflight(refused) or ("", "", "")
    assert (status, reason) == ("False", "PreflightRefused")
    assert message.startswith("Severe: no-clipping:")
    assert [(e.type, e.reason) for e in refused.events] == [("Warning", "PreflightRefused")]

    later = advance(refused.status, world(spec, preflight_pod=None, now=T0 + timedelta(minutes=5)))
    assert later.launch is None
    assert preflight(later) == preflight(refused), "the refusal stands for this generation"
    assert later.events == ()

    fixed = PreflightPodResult("job-preflight-g2", PodOutcome.FACTS, facts=clean_facts())
    started = advance(refused.status, world(spec, generation=2, preflight_pod=fixed))
    assert started.launch is not None, "a changed spec whose preflight passes starts workers"
    assert started.status.phase is Phase.RUNNING
    assert (preflight(started) or ("",))[:2] == ("True", "PreflightPassed")
    assert [e.reason for e in started.events] == ["PreflightPassed", "Created"]


def test_refuse_mode_without_facts_does_not_start() -> None:
    spec = job_spec(preflight=REFUSE)
    failed = PreflightPodResult("job-preflight-g1", PodOutcome.FAILED, detail="Error, exit 1")
    step = advance(StableTrainingJobStatus(), world(spec, preflight_pod=failed))
    assert step.launch is None
    status, reason, message = preflight(step) or ("", "", "")
    assert (status, reason) == ("False", "PreflightPodFailed")
    assert "Error, exit 1" in message


def test_warn_mode_starts_workers_at_once() -> None:
    step = advance(StableTrainingJobStatus(), world(job_spec()))
    assert step.launch is not None
    assert preflight(step) is None


def _pod(phase: str, message: str | None, exit_code: int = 0) -> dict[str, Any]:
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {"name": "job-preflight-g1"},
        "status": {"phase": phase, "containerStatuses": [{"state": {"terminated": terminated}}]},
    }


def test_reading_the_preflight_pod() -> None:
    facts = clean_facts()
    assert read_preflight_pod(_pod("Succeeded", facts.to_json())).facts == facts
    running_pod = {"metadata": {"name": "p"}, "status": {"phase": "Running"}}
    assert read_preflight_pod(running_pod).outcome is PodOutcome.PENDING
    crashed = read_preflight_pod(_pod("Failed", "Traceback: boom", exit_code=1))
    assert crashed.outcome is PodOutcome.FAILED
    assert crashed.detail == "Error, exit code 1: Traceback: boom"
    silent = read_preflight_pod(_pod("Succeeded", None))
    assert silent.detail.endswith("no termination message"), "script never built a Guard"
    garbage = read_preflight_pod(_pod("Succeeded", json.dumps({"maxGradNorm": "x"})))
    assert garbage.outcome is PodOutcome.FAILED
    assert "invalid preflight facts" in garbage.detail


def test_the_preflight_pod_is_the_worker_template_alone_and_never_a_worker() -> None:
    spec = job_spec(workers={
        "nodes": 4, "processesPerNode": 2,
        "template": {"spec": {"containers": [{"name": "t", "command": ["torchrun", "x.py"]}]}},
    }, preflight=REFUSE)  # fmt: skip
    job = pods.JobRef("job", "ns", "uid-1")
    pod = build_preflight_pod(spec, job, 3)
    assert pod["metadata"]["name"] == "job-preflight-g3"
    labels = pod["metadata"]["labels"]
    assert labels == {naming.JOB_LABEL: "job", PREFLIGHT_LABEL: "job"}
    assert pod_facts(pod) is None, "the worker index ignores it"
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STABLETRAIN_PREFLIGHT"] == "1"
    assert env["PET_NNODES"] == "1"
    assert env["PET_NPROC_PER_NODE"] == "2", "the same ranks per node as the workers"
    assert env["PET_RDZV_ENDPOINT"] == "127.0.0.1:29400"
    assert env["PET_RDZV_ID"] == "job-preflight-g3"
    assert "STABLETRAIN_DIRECTIVES_PATH" not in env
    assert container["command"] == ["torchrun", "x.py"]
    mounts = {m["name"] for m in container["volumeMounts"]}
    assert {"stabletrain-local", "stabletrain-pfs"} <= mounts
    assert "stabletrain-directives" not in mounts
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
