"""spec.checkpoints reaches the real pods and is obeyed (issue 14, point 1): the tiny GPT's
pods carry the interval and the retentions in their env, the script saves when the agent
says (`guard.is_save_step()`), and what is left on each node's local tier and on the PFS,
read from the pods' own files, is the retention's newest multiples of the interval.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stabletrain_agent.checkpoint.layout import iter_attempt_dirs, local_part_root, parse_node
from stabletrain_contract import env
from stabletrain_operator.naming import local_tier_host_path
from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess
from support.tinygpt import StepLogs, job_manifest

NAME = "ckpt-settings"
EVERY, LOCAL_KEEP, PFS_KEEP, STEPS = 10, 2, 3, 60


def steps_on(root: Path) -> list[int]:
    return [step for step, _, _ in iter_attempt_dirs(root)]


def test_interval_and_retention_of_the_spec_are_what_the_pods_do(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    manifest = job_manifest(NAME, {"TINYGPT_POISON_SHARDS": None, "TINYGPT_STEPS": str(STEPS)})
    checkpoints: dict[str, Any] = manifest["spec"]["checkpoints"]
    checkpoints["intervalSteps"] = EVERY
    checkpoints["local"]["retention"] = LOCAL_KEEP
    checkpoints["pfs"]["retention"] = PFS_KEEP
    checkpoints["spikeMarkers"] = 1
    jobs.create(manifest)
    done = jobs.wait(NAME, lambda s: s.get("phase") in ("Succeeded", "Failed"), 300, "the run")
    assert done["phase"] == "Succeeded", done.get("conditions")
    last = StepLogs(local_cluster.shared_dir, job_namespace).steps(0)[-1]
    assert last["step"] == STEPS
    assert (done["step"], done["loss"]) == (STEPS, float(f"{last['loss']:.4g}")), (
        "the finished job shows its final step and loss, not its last scrape's"
    )

    pods = jobs.pods(NAME)
    assert len(pods) == 2
    for pod in pods:
        variables = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert variables[env.CHECKPOINT_INTERVAL_STEPS] == str(EVERY)
        assert variables[env.LOCAL_RETENTION] == str(LOCAL_KEEP)
        assert variables[env.PFS_RETENTION] == str(PFS_KEEP)
        assert variables[env.SPIKE_MARKERS] == "1"

    newest = [STEPS - EVERY * i for i in reversed(range(PFS_KEEP))]
    local = {}
    for pod in pods:  # each pod's copies are under its node rank on its node's local tier
        variables = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        node = pod["spec"]["nodeName"]
        node_dir = manifest["spec"]["checkpoints"]["local"]["hostPath"]
        root = local_cluster.host_path(node, local_tier_host_path(node_dir, job_namespace, NAME))
        local[node] = steps_on(local_part_root(root, variables[env.NODE_RANK]))
    assert local == dict.fromkeys(local, newest[-LOCAL_KEEP:]), "each node keeps its retention"
    pfs = local_cluster.shared_dir / job_namespace / "pfs"
    assert steps_on(pfs) == newest, "the PFS keeps its retention, every node's part"
    for _, _, path in iter_attempt_dirs(pfs):
        assert sorted(parse_node(p.name) for p in path.iterdir()) == ["0", "1"]
    print(
        f"\nlocal tiers {local}, PFS {steps_on(pfs)} (every {EVERY}, keep {LOCAL_KEEP}/{PFS_KEEP})"
    )
