"""`stabletrain replay`: decisions on stdout (text or JSON lines), notes on stderr."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from stabletrain_operator.cli.replay.history import read_history
from stabletrain_operator.cli.replay.plot import write_plot
from stabletrain_operator.cli.replay.policy_file import default_policy, read_policy
from stabletrain_operator.cli.replay.replay_loop import PROGRESS_EVERY, ReplayedDecision, replay
from stabletrain_operator.cli.replay.report import json_line, text_block


def run_replay(args: argparse.Namespace, out: TextIO, notes: TextIO) -> int:
    history = read_history(Path(args.metrics))
    policy = default_policy() if args.policy is None else read_policy(Path(args.policy))
    rows = history.rows
    steps = [row.step for row in rows]
    relaunches = f", {history.relaunches} relaunches" if history.relaunches else ""
    print(
        f"replaying {len(rows)} rows (steps {min(steps)}-{max(steps)}{relaunches}) of "
        f"{history.path} with {policy.source}",
        file=notes,
    )

    def report(replayed: ReplayedDecision) -> None:
        print(json_line(replayed) if args.json else text_block(replayed), file=out, flush=True)

    def progress(done: int, total: int) -> None:
        print(f"\r  {done}/{total} rows", end="", file=notes, flush=True)

    interactive = notes.isatty()
    result = replay(
        history,
        policy,
        step_seconds=args.step_seconds,
        on_decision=report,
        on_progress=progress if interactive else None,
    )
    if interactive and len(rows) > PROGRESS_EVERY:
        print(f"\r  {len(rows)}/{len(rows)} rows", file=notes)
    if result.unused_columns:
        print(
            f"note: no detection.custom signal reads column(s) {', '.join(result.unused_columns)}",
            file=notes,
        )
    if result.failed_at is not None:
        print(
            f"note: the job would have failed at step {result.failed_at}; the rows after it "
            "were not replayed",
            file=notes,
        )
    count = len(result.decisions)
    summary = f"{count} decision{'s' if count != 1 else ''}"
    print(f"{summary}; LR scale at the end {result.lr_scale:.4g}", file=notes)
    if args.plot:
        write_plot(result, Path(args.plot), title=f"{history.path.name} with {policy.source}")
        print(f"plot written to {args.plot}", file=notes)
    return 0
