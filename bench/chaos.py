"""`make chaos`: the tiny GPT through every kind of fault at once, and what it cost.

One command, everything on this machine and stopped on any exit: a control plane, the CRD,
the operator, three local nodes (the job uses two, so a relaunch has one to move to).
First a CLEAN run of the job (no fault) for `--steps` steps with seed `--seed`; then the
CHAOS run of the same steps and seed under a seeded random fault plan over the clean run's
duration (support/chaos/schedule.py: every kind at least once, one fault group about every
`--interval` s, the operator SIGKILLed during a rollback, a torn checkpoint followed at once
by a crash). Printed and saved to `--out`: the plan, each fault's injection time, the
per-fault table (detect, stop, relaunch, process start, first resumed step, steps lost,
whether the action matched the kind), the decisions no fault explains, the per-kind
breakdown, ETTR (the clean run's time
over the chaos run's, both from job creation to the last step), the final loss against the
clean run's, the checkpoint and orphan checks, `chaos.json` and `chaos.png`.

    PYTHONPATH=tests .venv/bin/python bench/chaos.py [--minutes 15] [--seed 7] [--interval 120]

Targets (reported, never asserted): every fault healed with the action its kind expects and
no human action, ETTR >= 95% at one fault per 120 s, final loss within 3% of the clean run.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from stabletrain_operator import naming
from support.chaos.checks import check_checkpoints, orphans_after_delete
from support.chaos.inject import KINDS, Injector
from support.chaos.measure import incidents, measure_faults, summarize, unattributed
from support.chaos.plot import plot_chaos
from support.chaos.report import (
    applied_lines,
    breakdown,
    breakdown_lines,
    fault_table,
    schedule_lines,
    summary_lines,
    unattributed_lines,
    write_json,
)
from support.chaos.run import Applied, chaos_manifest, chaos_run, clean_run, pfs_dir
from support.chaos.schedule import ALL_KINDS, make_schedule, plan_json
from support.demo_stage import stage, stop_on_sigterm
from support.operator import checkpoint_key
from support.tinygpt import REPO

NAMESPACE = "chaos"
NODES = ("node-a", "node-b", "node-c")
PACE_S = 0.065
"""Seconds per step of the tiny GPT (2 ranks, gloo) on this 2-core machine when nothing else
runs (the clean run of 4,500 steps took 283.5 s, start-up included; under other work's load
it was 0.16 s); turns --minutes into a step count. A run shorter than its plan needs has its
gaps squeezed, which the plan's last line and a warning show."""
WARMUP_S = 30.0
"""No fault in the first seconds after the first step: a spike only trips past the
detection's 100-step warm-up, and a rollback needs a stable checkpoint 100 steps before
the onset (the first is at step 25)."""
TAIL_S = 30.0
"""No fault in the clean run's last seconds of training, so each has a run left to heal."""


def say(text: str) -> None:
    print(text, flush=True)


def keep_node_warnings(path: Path) -> None:
    """The local nodes' warnings (every heartbeat and pod sync while the API server is down
    is one) go to a file, not between the report's lines."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    nodes = logging.getLogger("support.localnode")
    nodes.addHandler(handler)
    nodes.propagate = False


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"(measured under load: load average {one:.1f} / {five:.1f} on {os.cpu_count()} cores)"


def applied_json(item: Applied, created_at: float) -> dict[str, Any]:
    injected = item.injected
    return {
        "index": item.planned.index, "kind": item.planned.kind,
        "at": injected.at if injected else None,
        "since_created": injected.at - created_at if injected else None,
        "target": injected.target if injected else "",
        "detail": injected.detail if injected else item.error,
        "phase": item.phase, "fired": item.fired,
    }  # fmt: skip


def run(args: argparse.Namespace, work: Path) -> int:
    steps = args.steps or round(args.minutes * 60 * 0.8 / PACE_S)
    out: Path = args.out
    say(f"stabletrain chaos: tiny GPT, {steps} steps, seed {args.seed}, one fault group about "
        f"every {args.interval:g} s")  # fmt: skip
    with stage(work, out, None, nodes=NODES, namespace=NAMESPACE) as staged:
        jobs, cluster = staged.jobs, staged.cluster
        say("clean run ...")
        clean = clean_run(jobs, cluster, NAMESPACE, chaos_manifest("clean", steps, args.seed),
                          timeout=steps * PACE_S * 6 + 300)  # fmt: skip
        if clean.status.get("phase") != "Succeeded" or clean.seconds is None:
            say(
                f"the clean run ended {clean.status.get('phase')}: {clean.status.get('conditions')}"
            )
            return 1
        say(f"  clean run: {clean.seconds:.1f} s {load_note()}")
        clean_left = orphans_after_delete(staged.api_client, NAMESPACE, "clean")
        window = (WARMUP_S, max(WARMUP_S + 1, (clean.training_seconds or 0.0) - TAIL_S))
        kinds = [k for k in ALL_KINDS if k in KINDS]
        missing = [k for k in ALL_KINDS if k not in KINDS]
        if missing:
            say(f"  not in the plan (the injector cannot do them yet): {', '.join(missing)}")
        plan = make_schedule(args.seed, window, args.interval, kinds)
        for line in schedule_lines(plan, args.seed):
            say(line)
        if plan[-1].at >= window[1] - 1:
            say(f"  warning: the plan was squeezed into the clean run's {window[1]:.0f} s of "
                f"training, faults are denser than one group every {args.interval:g} s; a "
                "longer run (--steps, --minutes) keeps the interval")  # fmt: skip
        write_json(out / "chaos-plan.json", {"seed": args.seed, "steps": steps,
                                             "plan": plan_json(plan)})  # fmt: skip
        manifest = chaos_manifest("chaos", steps, args.seed)
        injector = Injector(plane=staged.plane, cluster=cluster, operator=staged.operator,
                            api_client=staged.api_client, namespace=NAMESPACE, job="chaos",
                            pfs_dir=pfs_dir(cluster, NAMESPACE, "chaos"))  # fmt: skip
        say("chaos run ...")
        give_up = args.give_up * 60 or clean.seconds * 3 + 300
        chaos = chaos_run(injector, jobs, cluster=cluster, api_client=staged.api_client,
                          namespace=NAMESPACE, manifest=manifest, plan=plan, seed=args.seed,
                          timeout=give_up, say=say)  # fmt: skip
        found = incidents(chaos.recorder, chaos.run.status, chaos.run.logs, nodes=2)
        summary = summarize(clean, chaos.run, steps, [p for _, p, _ in chaos.recorder.phases()])
        results = measure_faults(chaos.applied, chaos.run, found, summary.pace)
        stray = unattributed(chaos.applied, chaos.run, found)
        torn = [a.injected.target for a in chaos.applied
                if a.injected is not None and a.planned.kind == "corrupt-checkpoint"]  # fmt: skip
        node_dir = manifest["spec"]["checkpoints"]["local"]["hostPath"]
        host_path = naming.local_tier_host_path(node_dir, NAMESPACE, "chaos")
        key = checkpoint_key(client.CoreV1Api(staged.api_client), NAMESPACE, "chaos")
        checkpoints = check_checkpoints(cluster, host_path, pfs_dir(cluster, NAMESPACE, "chaos"),
                                        torn, key)  # fmt: skip
        events = [  # why each pod was kept or replaced, said by the operator (before the delete)
            {"time": e.get("lastTimestamp") or e.get("eventTime"), "reason": e.get("reason"),
             "message": e.get("message")}
            for e in jobs.events("chaos")
        ]  # fmt: skip
        orphans = orphans_after_delete(staged.api_client, NAMESPACE, "chaos")
        say("")
        for line in [
            *schedule_lines(plan, args.seed), "",
            *applied_lines(chaos.applied, chaos.run.first_step_at or chaos.run.created_at), "",
            *fault_table(results), "",
            *unattributed_lines(stray, chaos.run.first_step_at or chaos.run.created_at), "",
            *breakdown_lines(results), "",
            *summary_lines(summary, results, checkpoints, [*clean_left, *orphans], load_note()),
        ]:  # fmt: skip
            say(line)
        png = out / "chaos.png"
        plot_chaos(clean, chaos.run, applied=chaos.applied, found=found, ettr=summary.ettr, out=png)
        payload: dict[str, Any] = {
            "seed": args.seed, "steps": steps, "interval": args.interval,
            "plan": plan_json(plan),
            "injected": [applied_json(a, chaos.run.created_at) for a in chaos.applied],
            "faults": results, "unattributed": [d.entry for d in stray],
            "by_kind": breakdown(results), "summary": summary,
            "ettr": summary.ettr, "checkpoints": checkpoints, "orphans": [*clean_left, *orphans],
            "final_phase": chaos.run.status.get("phase"),
            "rollback_history": chaos.run.status.get("rollbackHistory"),
            "events": events,
            "load": load_note(),
        }  # fmt: skip
        write_json(out / "chaos.json", payload)
        for name, result in (("clean", clean), ("chaos", chaos.run)):  # every step's time and loss
            shutil.copytree(result.logs.directory, out / "step-logs" / name, dirs_exist_ok=True)
        say(f"\nwrote {png} and {out / 'chaos.json'}")
        healed = all(r.matched for r in results) and summary.human_actions == 0
        return 0 if healed and not checkpoints.problems and not orphans else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--minutes",
        type=float,
        default=15.0,
        help="about how long the chaos run takes (sets the step count)",
    )
    parser.add_argument("--steps", type=int, default=0, help="the step count (overrides --minutes)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the job and of the fault plan")
    parser.add_argument(
        "--interval", type=float, default=120.0, help="mean seconds between fault groups"
    )
    parser.add_argument("--out", type=Path, default=REPO / "out" / "chaos")
    parser.add_argument(
        "--give-up",
        type=float,
        default=0.0,
        help="minutes after its creation to stop waiting for a chaos job that "
        "does not finish, and report (default: 3 x the clean run + 5)",
    )
    args = parser.parse_args(argv)  # fmt: skip
    if args.minutes <= 0 or args.interval <= 0 or args.steps < 0 or args.give_up < 0:
        parser.error(
            "--minutes and --interval must be positive, --steps and --give-up not negative"
        )
    stop_on_sigterm()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    keep_node_warnings(args.out / "localnode.log")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stabletrain-chaos-") as work:
        try:
            code = run(args, Path(work))
        except KeyboardInterrupt:
            say("interrupted: everything the chaos run started has been stopped")
            return 130
    say(f"make chaos took {time.monotonic() - began:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
