"""`make demo`: a real tiny GPT heals itself from a poisoned shard, start to finish.

Everything runs on this machine and is stopped on any exit (done, failure, Ctrl-C, SIGTERM):
a real control plane (etcd, kube-apiserver, kube-controller-manager), the stabletrain CRD,
the operator as its own process, two local nodes running the job's pods as real processes,
and the example's StableTrainingJob exactly as `examples/tiny-gpt/stabletrainingjob.yaml`
writes it (default detection, default policy, shard-0008 poisoned).

It prints the phases as they happen, then the recovery timeline, `kubectl get stj` and the
job's Events, and writes `out/demo/tiny-gpt-recovery.png` (loss against step with the
baseline, the rollback and the skipped range), the metrics as a `stabletrain replay` CSV,
and the operator's log. `make demo` runs it; by hand, from the repository:
`PYTHONPATH=tests python examples/tiny-gpt/demo.py [--out DIR]` (the stage it runs on is
the test harness's, in `tests/support`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from support.demo_stage import (
    JOB,
    NAMESPACE,
    follow,
    kubectl,
    say,
    stage,
    stop_on_sigterm,
)
from support.lossplot import plot_recovery, skip_label
from support.timeline import format_timeline, rollback_timeline
from support.tinygpt import MANIFEST, REPO, StepLogs, job_manifest, write_replay_csv


def run(out: Path, work: Path) -> int:
    say("stabletrain demo: a tiny GPT on Shakespeare, 2 nodes x 1 rank, shard-0008 poisoned")
    with stage(work, out, job_manifest(JOB)) as staged:
        plane, cluster, jobs, recorder = (
            staged.plane, staged.cluster, staged.jobs, staged.recorder,
        )  # fmt: skip
        operator_log = out / "operator.log"
        say(f"created StableTrainingJob {NAMESPACE}/{JOB} from {MANIFEST.relative_to(REPO)}")
        status = follow(jobs)
        recorder.stop()
        logs = StepLogs(cluster.shared_dir, NAMESPACE)
        say("")
        if status.get("phase") != "Succeeded" or not status.get("rollbackHistory"):
            say(f"the job ended {status.get('phase')} without healing; status: {status}")
            say(kubectl(plane, "get", "events", "-n", NAMESPACE))
            return 1
        for number, record in enumerate(status["rollbackHistory"], 1):
            say(f"  decision {number}: {json.dumps(record)}")
        entry = status["rollbackHistory"][0]
        skipped = "; ".join(skip_label(s) for s in entry["skipped"])
        say(
            f"rollback: {entry['signal']} ({entry.get('anomalyClass')}) with onset at step "
            f"{entry['onsetStep']}, tripped at step {entry['fromStep']}, resumed from step "
            f"{entry['toStep']}, LR scale {entry['lrScale']}, skipped {skipped}"
        )
        resumed = logs.steps(entry["attempt"])
        poisoned = sum(r["poisoned"] for r in resumed)
        last = resumed[-1]
        say(
            f"attempt {entry['attempt']} read {poisoned} poisoned batches and finished at step "
            f"{last['step']}, loss {last['loss']:.3f}"
        )
        say("\nrecovery timeline (seconds after the first anomalous step):")
        timeline = rollback_timeline(
            recorder, logs, pod_log=lambda pod: cluster.logs(NAMESPACE, pod)
        )
        say(format_timeline(timeline))
        say(f"\n$ kubectl get stj -n {NAMESPACE}")
        say(kubectl(plane, "get", "stj", "-n", NAMESPACE).rstrip())
        selector = f"involvedObject.name={JOB}"
        say(f"\n$ kubectl get events -n {NAMESPACE} --field-selector {selector}")
        # resourceVersion, not creationTimestamp: the latter has one-second resolution and
        # the rollback emits several Events within one second.
        order = "--sort-by=.metadata.resourceVersion"
        events = kubectl(
            plane, "get", "events", "-n", NAMESPACE, order, "--field-selector", selector
        )
        say(events.rstrip())
        png = out / "tiny-gpt-recovery.png"
        plot_recovery(logs, status, png, "tiny GPT on Shakespeare: a poisoned shard, healed")
        csv = out / "tiny-gpt-metrics.csv"
        rows = write_replay_csv(logs, csv)
        say(f"\nwrote {png}")
        say(f"wrote {csv} ({rows} rows; try: stabletrain replay {csv})")
        say(f"wrote {operator_log}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "out" / "demo")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stabletrain-demo-") as work:
        try:
            return run(args.out.resolve(), Path(work))
        except KeyboardInterrupt:
            say("interrupted: everything the demo started has been stopped")
            return 130


if __name__ == "__main__":
    sys.exit(main())
