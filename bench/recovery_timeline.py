"""How fast a real recovery is, in place and with recreated pods, side by side.

Runs the example job (`examples/tiny-gpt/stabletrainingjob.yaml`: tiny GPT, 2 nodes x 1
rank, default detection and policy) on a real control plane with the operator and the local
nodes, as `make demo` does, and times each recovery from the outside
(support/timeline.py: API watch events, the ranks' step logs and the supervisors' logs,
one clock). Two faults, each under `recovery.restart: InPlace` and `RecreatePods`:

* spike: shard-0008 poisoned, a Rollback (decision = the job enters Stopping);
* killed: rank 1 SIGKILLs itself at step 70 of a clean run (about 10 s in), a
  RestartFromLatest.

Reported per fault and mode, median (min, max) over `--runs`: the anomalous step (or the
kill) -> detection, detection -> processes stopped, -> plan, -> every rank running the
next attempt, its start in stages (the training script entered: torchrun's rendezvous and,
cold, the imports; the process group joined; model, data and agent built; the checkpoint
restored), -> its first training step, and the steps lost. The targets (in place:
detection -> first resumed step <= 3 s) are reported, not asserted.

    PYTHONPATH=tests .venv/bin/python bench/recovery_timeline.py [--runs 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from support.demo_stage import JOB, NAMESPACE, follow, stage, stop_on_sigterm
from support.timeline import RollbackTimeline, format_timeline, rollback_timeline
from support.tinygpt import REPO, StepLogs, job_manifest

TARGET_IN_PLACE_S = 3.0
FAULTS: dict[str, dict[str, str | None]] = {
    "spike": {"TINYGPT_STEPS": "170"},
    "killed": {
        "TINYGPT_POISON_SHARDS": None,
        "TINYGPT_STEPS": "120",
        "TINYGPT_KILL_AT": "70",
        "TINYGPT_KILL_RANK": "1",
        # 0.1 s a step: the kill comes about 10 s into the attempt, as a real one comes long
        # after its start, when the next attempt's standby has done its imports
        "TINYGPT_STEP_SECONDS": "0.1",
    },
}
MODES = ("InPlace", "RecreatePods")


def manifest(fault: str, mode: str) -> dict[str, Any]:
    job = job_manifest(JOB, FAULTS[fault])
    job["spec"]["recovery"] = {"restart": mode}
    return job


def one_run(fault: str, mode: str, index: int) -> RollbackTimeline:
    out = REPO / "out" / "bench-recovery" / f"{fault}-{mode}-{index}"
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="stabletrain-bench-"))
    try:
        with stage(work, out, manifest(fault, mode)) as staged:
            status = follow(staged.jobs)
            staged.recorder.stop()
            if status.get("phase") != "Succeeded" or not status.get("rollbackHistory"):
                raise RuntimeError(f"{fault}/{mode} run {index} did not heal: {status}")
            logs = StepLogs(staged.cluster.shared_dir, NAMESPACE)
            cluster = staged.cluster
            timeline = rollback_timeline(
                staged.recorder, logs, pod_log=lambda pod: cluster.logs(NAMESPACE, pod)
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{fault}, {mode}, run {index}:\n{format_timeline(timeline)}", flush=True)
    return timeline


def seconds(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "not observed"
    if len(known) == 1:
        return f"{known[0]:6.2f} s"
    return f"{statistics.median(known):6.2f} s ({min(known):.2f}-{max(known):.2f})"


def since(runs: Sequence[RollbackTimeline], pick: str, base: str) -> list[float | None]:
    values: list[float | None] = []
    for timeline in runs:
        at, start = getattr(timeline, pick), getattr(timeline, base)
        values.append(None if at is None or start is None else at - start)
    return values


def start_since(runs: Sequence[RollbackTimeline], stage: str) -> list[float | None]:
    """Seconds from detection to the last rank past a stage of its start (StartStages)."""
    return [None if t.start is None else getattr(t.start, stage) - t.detected_at for t in runs]


ROWS: tuple[tuple[str, Callable[[Sequence[RollbackTimeline]], list[float | None]]], ...] = (
    ("anomaly -> detection", lambda r: since(r, "detected_at", "anomalous_step_at")),
    ("detection -> processes stopped", lambda r: since(r, "stopped_at", "detected_at")),
    ("detection -> plan made", lambda r: since(r, "planned_at", "detected_at")),
    ("detection -> every rank running", lambda r: since(r, "relaunched_at", "detected_at")),
    ("detection -> script entered", lambda r: start_since(r, "entered_at")),
    ("detection -> process group joined", lambda r: start_since(r, "joined_at")),
    ("detection -> model, data, agent built", lambda r: start_since(r, "built_at")),
    ("detection -> checkpoint restored", lambda r: start_since(r, "restored_at")),
    ("detection -> first resumed step", lambda r: since(r, "first_resumed_step_at", "detected_at")),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    stop_on_sigterm()
    faults, modes = args.faults.split(","), args.modes.split(",")
    results: dict[tuple[str, str], list[RollbackTimeline]] = {}
    for index in range(args.runs):  # interleaved: load drifts alike over every column
        for fault in faults:
            for mode in modes:
                results.setdefault((fault, mode), []).append(one_run(fault, mode, index))
    for fault in faults:
        print(f"\n{fault}: median (min-max) of {args.runs} run(s)")
        print(f"  {'':40}" + "".join(f"{mode:>26}" for mode in modes))
        for label, measure in ROWS:
            print(f"  {label:40}" + "".join(f"{seconds(measure(results[fault, m])):>26}"
                                             for m in modes))  # fmt: skip
        lost = "".join(f"{[t.steps_lost for t in results[fault, m]]!s:>26}" for m in modes)
        print(f"  {'steps lost':40}{lost}")
        if "InPlace" in modes:
            first = [v for v in ROWS[-1][1](results[fault, "InPlace"]) if v is not None]
            verdict = "met" if first and statistics.median(first) <= TARGET_IN_PLACE_S else "MISSED"
            print(f"  in place, detection -> first resumed step <= {TARGET_IN_PLACE_S:.0f} s: "
                  f"{verdict}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
