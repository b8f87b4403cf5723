"""How fast a real rollback is, measured end to end on this machine.

Runs the example job (`examples/tiny-gpt/stabletrainingjob.yaml`: tiny GPT, 2 nodes x 1
rank, shard-0008 poisoned, default detection and policy) on a real control plane with the
operator and the local nodes, exactly as `make demo` does, and times its rollback from the
outside (support/timeline.py: API watch events and the ranks' step logs, one clock):

* detection latency: the first anomalous step -> the agent's trip -> the operator's
  reaction (the job enters Stopping);
* stop: detection -> every pod gone (Planning); plan: -> Relaunching;
* relaunch: detection -> the next attempt's pods Running, and -> its first training step;
* steps lost: the steps trained between the checkpoint resumed and the trip.

The targets (detection -> pods relaunched <= 10 s, detection -> first resumed step <= 30 s)
are reported, not asserted; medians over `--runs` runs when there are several.

    PYTHONPATH=tests .venv/bin/python bench/recovery_timeline.py [--runs 1]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from support.demo_stage import JOB, NAMESPACE, follow, stage, stop_on_sigterm
from support.timeline import RollbackTimeline, format_timeline, rollback_timeline
from support.tinygpt import REPO, StepLogs, job_manifest

TARGET_RELAUNCH_S = 10.0
TARGET_FIRST_STEP_S = 30.0


def one_run(index: int) -> RollbackTimeline:
    out = REPO / "out" / "bench-recovery" / f"run-{index}"
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="stabletrain-bench-"))
    try:
        with stage(work, out, job_manifest(JOB)) as staged:
            status = follow(staged.jobs)
            staged.recorder.stop()
            if status.get("phase") != "Succeeded" or not status.get("rollbackHistory"):
                raise RuntimeError(f"run {index} did not heal: {status.get('conditions')}")
            logs = StepLogs(staged.cluster.shared_dir, NAMESPACE)
            timeline = rollback_timeline(staged.recorder, logs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(format_timeline(timeline), flush=True)
    return timeline


def seconds(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "not observed"
    if len(known) == 1:
        return f"{known[0]:.2f} s"
    return f"median {statistics.median(known):.2f} s (min {min(known):.2f}, max {max(known):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    stop_on_sigterm()
    runs = [one_run(i) for i in range(args.runs)]

    def since(pick: str, base: str) -> list[float | None]:
        values: list[float | None] = []
        for t in runs:
            at, start = getattr(t, pick), getattr(t, base)
            values.append(None if at is None else at - start)
        return values

    relaunch = since("relaunched_at", "detected_at")
    first_step = since("first_resumed_step_at", "detected_at")
    print(f"\nrecovery timeline of the tiny-GPT rollback, {len(runs)} run(s):")
    print(
        f"  anomalous step -> agent trip          {seconds(since('trip_at', 'anomalous_step_at'))}"
    )
    print(f"  agent trip -> operator detection      {seconds(since('detected_at', 'trip_at'))}")
    print(f"  detection -> pods stopped             {seconds(since('stopped_at', 'detected_at'))}")
    print(f"  detection -> plan made                {seconds(since('planned_at', 'detected_at'))}")
    print(f"  detection -> pods relaunched          {seconds(relaunch)}"
          f"  (target <= {TARGET_RELAUNCH_S:.0f} s)")  # fmt: skip
    print(f"  detection -> first resumed step       {seconds(first_step)}"
          f"  (target <= {TARGET_FIRST_STEP_S:.0f} s)")  # fmt: skip
    print(f"  steps lost (trip - resumed step)      {[t.steps_lost for t in runs]}")
    met = all(v is not None and v <= TARGET_RELAUNCH_S for v in relaunch) and all(
        v is not None and v <= TARGET_FIRST_STEP_S for v in first_step
    )
    print(f"  targets {'met' if met else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
