"""The issue's case on the real tiny GPT: once the run trains, its rule for LossSpike is edited
to Alert (the other default rules unchanged), before the poisoned shard spikes the loss at
step 129. The edit reaches the running pods as live directives: they stop tripping on
LossSpike, the spike raises one Alert, nothing is stopped or restarted, and the job
completes; the pods' own logs show the new directives generation before the spike.

Before, the pods kept their attempt's first directives: they tripped at 132 and the edited
rule, applied to the stopped run, restarted it next to the onset into the bad data.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from stabletrain_operator.api.spec import default_rules
from support.localnode import LocalCluster
from support.operator import Jobs
from support.timeline import Recorder
from support.tinygpt import StepLogs, job_manifest

ONSET = 129
"""The first step reading the example's poisoned shard-0008."""


@pytest.mark.usefixtures("operator")
def test_a_rule_edited_to_alert_before_the_spike_alerts_once_and_never_stops(
    jobs: Jobs, job_namespace: str, local_cluster: LocalCluster, api_client: client.ApiClient
) -> None:
    started = time.monotonic()
    rules = [r.model_dump(mode="json", by_alias=True, exclude_none=True) for r in default_rules()]
    (spike,) = [r for r in rules if r["name"] == "loss-spike"]
    spike["action"] = "Alert"
    # The same step floor as the other tiny-GPT e2e tests: at 20-35 steps/s an idle machine
    # would reach the poisoned shard a few seconds after the first step.
    env = {"TINYGPT_STEPS": "170", "TINYGPT_STEP_SECONDS": "0.05"}
    with Recorder(api_client, job_namespace, "edited") as recorder:
        jobs.create(job_manifest("edited", env))
        training = jobs.wait("edited", lambda s: (s.get("step") or 0) >= 1, 300, "the first step")
        jobs.patch_spec("edited", {"recovery": {"rules": rules}})
        edited_at_step = training["step"]
        applied = jobs.wait("edited", lambda s: s.get("observedGeneration") == 2, 120,
                            "the pods to apply generation 2")  # fmt: skip
        done = jobs.wait("edited", lambda s: s.get("phase") in ("Succeeded", "Failed"), 600,
                         "the job to complete")  # fmt: skip
    assert done["phase"] == "Succeeded", done.get("conditions")
    assert (done["attempt"], done["counters"]["rollbacks"], done["counters"]["restarts"]) == (
        0,
        0,
        0,
    ), "nothing stopped, nothing restarted"
    assert "Stopping" not in [phase for _, phase, _ in recorder.phases()]
    alerts = [e for e in done["rollbackHistory"] if e["signal"] == "LossSpike"]
    assert [(e["action"], e["rule"], e["onsetStep"]) for e in alerts] == [
        ("Alert", "loss-spike", ONSET)
    ], done["rollbackHistory"]
    assert all(e["action"] == "Alert" for e in done["rollbackHistory"])
    assert done["observedGeneration"] == 2
    assert done["policy"]["specGeneration"] == 2
    assert done["policy"]["recovery"]["rules"][1]["action"] == "Alert"
    sent = done["policy"]["directivesGeneration"]
    (awaiting,) = [e["message"] for e in jobs.events("edited") if e["reason"] == "AwaitingPods"]
    assert "trip on NonFinite, was NonFinite, LossSpike" in awaiting

    # The pods' own logs: every rank ran the new generation from a step before the onset,
    # and the agent announced it in the container's log.
    logs = StepLogs(local_cluster.shared_dir, job_namespace)
    adopted = []
    for rank in (0, 1):
        steps = logs.steps(0, rank=rank)
        first = next(r["step"] for r in steps if r["generation"] == sent)
        assert first < ONSET, f"rank {rank} adopted generation {sent} at step {first}"
        assert not any(r["generation"] < sent for r in steps if r["step"] >= first)
        assert steps[-1]["step"] == 170
        adopted.append(first)
    announced = local_cluster.logs(job_namespace, "edited-a0-0")
    assert f"stabletrain: directives generation {sent} of attempt 0 in force from step" in (
        announced
    )
    assert "trip on NonFinite, LR scale 1" in announced
    print(
        f"\nedit at step {edited_at_step}; generation {sent} in force from step(s) {adopted} "
        f"(observedGeneration 2 seen at step {applied.get('step')}); spike onset {ONSET}: "
        f"{len(alerts)} Alert, 0 stops; {time.monotonic() - started:.0f} s"
    )
