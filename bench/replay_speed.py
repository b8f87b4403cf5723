"""How long `stabletrain replay` takes on a 20,000-step history, against baselines measured
in the same run.

The history is synthetic but realistic in shape: a decaying loss with noise, grad norm, LR,
tokens/s and one custom column, a sustained spike, a NaN stretch and one-step outliers.
Each round times, back to back and in alternating order so that machine load hits all
alike:

* the bare CSV parse (csv module + float(), nothing else): the floor any replay pays;
* the replay's own reader (validation, error positions);
* the agent's SignalMonitor alone over the parsed rows;
* the whole replay in process (reader + monitor + policy engine);

and, once per round, the CLI as a user runs it (`stabletrain replay --json`, a new process
including interpreter start). Medians over the rounds are printed with their ratio to the
bare parse; the target (under 2 s for the CLI on this machine) is reported, not asserted.

    .venv/bin/python bench/replay_speed.py [--steps 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stabletrain_contract.signals.monitor import SignalMonitor, StepObservation
from stabletrain_operator.cli.replay.history import MetricsHistory, read_history
from stabletrain_operator.cli.replay.policy_file import default_policy
from stabletrain_operator.cli.replay.replay_loop import replay
from stabletrain_operator.policy import trip_signals

TARGET_SECONDS = 2.0
CLI = Path(sys.executable).parent / "stabletrain"


def write_history(path: Path, steps: int) -> None:
    rng = random.Random(3)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "loss", "grad_norm", "lr", "tokens_per_second", "val_loss"])
        for step in range(steps):
            loss = (2.0 + 3.0 * math.exp(-step / 4000)) * (1 + rng.gauss(0, 0.03))
            if steps // 2 <= step < steps // 2 + 150:
                loss *= 2.2
            if step % 997 == 0:
                loss *= 1.5
            cell = "nan" if 3 * steps // 4 <= step < 3 * steps // 4 + 5 else f"{loss:.5f}"
            writer.writerow(
                [
                    step,
                    cell,
                    f"{1 + rng.random() * 0.2:.4f}",
                    "0.0003",
                    f"{50000 + rng.gauss(0, 500):.1f}",
                    f"{loss * 1.05:.5f}",
                ]
            )


def bare_parse(path: Path) -> int:
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        next(reader)
        count = 0
        for cells in reader:
            int(cells[0])
            for cell in cells[1:]:
                float(cell)
            count += 1
    return count


def monitor_only(history: MetricsHistory) -> int:
    policy = default_policy()
    monitor = SignalMonitor(policy.detection, trip_signals(policy.recovery))
    trips = 0
    for index, row in enumerate(history.rows):
        verdict = monitor.observe(
            StepObservation(
                step=row.step,
                loss=row.loss,
                grad_norm=row.grad_norm,
                lr=row.lr or 0.0,
                tokens_per_second=row.tokens_per_second,
                custom=row.custom,
                checkpoint_in_flight=False,
                steps_since_start=index,
            )
        )
        trips += verdict.trip
    return trips


def full_replay(path: Path) -> int:
    return len(replay(read_history(path), default_policy()).decisions)


def cli_process(path: Path) -> int:
    done = subprocess.run(
        [str(CLI), "replay", "--json", str(path)], capture_output=True, text=True, check=True
    )
    return len(done.stdout.splitlines())


def timed(work: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.csv"
        write_history(path, args.steps)
        parsed = read_history(path)
        cases: dict[str, Callable[[], int]] = {
            "bare CSV parse (baseline)": lambda: bare_parse(path),
            "replay reader": lambda: len(read_history(path).rows),
            "SignalMonitor alone": lambda: monitor_only(parsed),
            "replay in process": lambda: full_replay(path),
            "stabletrain replay --json (process)": lambda: cli_process(path),
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        outcomes: dict[str, int] = {}
        for round_index in range(args.rounds):
            order = list(cases) if round_index % 2 == 0 else list(reversed(cases))
            for name in order:
                seconds, outcomes[name] = timed(cases[name])
                samples[name].append(seconds)
    baseline = statistics.median(samples["bare CSV parse (baseline)"])
    print(f"replay of a {args.steps}-step history, {args.rounds} rounds, median wall time:")
    for name, values in samples.items():
        median = statistics.median(values)
        spread = f"{min(values):.3f}-{max(values):.3f}"
        print(f"  {name:38s} {median:7.3f} s  (range {spread})  x{median / baseline:5.1f} baseline")
    print(
        f"  decisions: {outcomes['replay in process']} in process, "
        f"{outcomes['stabletrain replay --json (process)']} JSON lines from the CLI; "
        f"monitor trips: {outcomes['SignalMonitor alone']}"
    )
    cli = statistics.median(samples["stabletrain replay --json (process)"])
    verdict = "within" if cli < TARGET_SECONDS else "OVER"
    print(f"  target: CLI under {TARGET_SECONDS:.1f} s -> {verdict} ({cli:.2f} s)")


if __name__ == "__main__":
    main()
