"""The operator SIGKILLed right after each status write of a rollback (planned crash points)
and restarted: the rollback completes exactly once, with no extra attempt or pod. The crash
points are the test wrapper's (support/operator_crashpoints.py), not the product's."""

from __future__ import annotations

import time
from pathlib import Path

from kubernetes import client

from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.operator import Jobs, job_manifest, running_operator, worker_log
from support.operator_crashpoints import CRASH_AFTER_ENV, CRASH_MARKERS_ENV

PHASES = ("Stopping", "Planning", "Relaunching", "Confirming", "Running")
ROLLBACK = {"minStepsBeforeOnset": 5, "skipStepsBeforeOnset": 2, "skipStepsAfterOnset": 5,
            "rewarmupSteps": 3}  # fmt: skip
RULES = [{"name": "nan", "onSignals": ["NonFinite"], "action": "Rollback", "rollback": ROLLBACK}]


def test_operator_killed_after_every_rollback_step_finishes_it_exactly_once(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    jobs: Jobs,
    local_cluster: LocalCluster,
    tmp_path: Path,
) -> None:
    markers = tmp_path / "crashed-after"
    markers.mkdir()
    env = {CRASH_AFTER_ENV: ",".join(PHASES), CRASH_MARKERS_ENV: str(markers)}
    namespace = jobs.namespace
    worker = {"ST_STEP_SECONDS": "0.1", "ST_CKPT_EVERY": "5", "ST_STEPS": "45", "ST_NAN_AT": "22"}
    with running_operator(
        control_plane, api_client, namespace, tmp_path / "operator.log", env
    ) as operator:
        # Recreated pods: the relaunch's creates are the steps a crash may interrupt here
        # (tests/e2e/test_operator_killed.py kills it during a restart in place).
        jobs.create(
            job_manifest("crash", worker, recovery={"rules": RULES, "restart": "RecreatePods"})
        )
        restarts: list[tuple[str, ...]] = []
        deadline = time.monotonic() + 240
        while jobs.status("crash").get("phase") != "Succeeded":
            assert time.monotonic() < deadline, f"not done; crashed after {restarts}"
            if not operator.alive():
                restarts.append(tuple(sorted(m.name for m in markers.iterdir())))
                operator.start()
            time.sleep(0.2)
        log = operator.log()
        done = jobs.status("crash")
        pods = sorted(p["metadata"]["name"] for p in jobs.pods("crash"))
        core = client.CoreV1Api(api_client)
        config_maps = core.list_namespaced_config_map(namespace).items  # type: ignore[union-attr]

    assert sorted(m.name for m in markers.iterdir()) == sorted(PHASES)
    assert len(restarts) == len(PHASES), restarts
    assert log.count("planned crash point") == len(PHASES)
    (entry,) = done["rollbackHistory"]
    assert (entry["onsetStep"], entry["toStep"], entry["lrScale"]) == (22, 15, 0.5)
    assert done["attempt"] == 1
    assert done["counters"]["rollbacks"] == 1
    assert done["counters"]["trips"] == 1
    assert done["directivesGeneration"] == 2
    assert pods == ["crash-a1-0", "crash-a1-1"], "attempt 0 gone, one pod per rank of attempt 1"
    directives = sorted(c.metadata.name for c in config_maps if "directives" in c.metadata.name)
    assert directives == ["crash-a0-directives", "crash-a1-directives"], "no third attempt"
    for rank in (0, 1):
        steps = [r["step"] for r in worker_log(local_cluster, namespace, attempt=1, rank=rank)]
        assert steps == list(range(16, 46)), "attempt 1 ran once, from the checkpoint to the end"
    print(f"crashed after {PHASES}, restarted {len(restarts)} times; history {entry}")
