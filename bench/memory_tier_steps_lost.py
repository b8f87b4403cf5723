"""Steps a killed rank costs with the memory tier against without it, side by side.

The tiny-GPT example as 2 pods of 1 rank under real torchrun (tests/support/memory_restart.py):
checkpoints every 25 steps (the example's spec), memory snapshots every `--interval` steps.
For each kill point rank 1 SIGKILLs itself before that step; the storage it leaves is then
restarted twice with a RestartFromLatest planned from the pods' torch-free scans: in the same
pods (their memory tiers kept, as a restart in place keeps them) and in recreated pods (their
memory gone: the recovery without the tier). Reported per kill: the step each restart
resumed from, the tier the pods restored it from (their own logs), and the steps lost
(steps done before the kill minus the step resumed from).

    PYTHONPATH=tests .venv/bin/python -W ignore bench/memory_tier_steps_lost.py \\
        [--interval 10] [--kills 25,38,45,50,60]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from support.memory_restart import CHECKPOINT_INTERVAL, Resumed, kill_then_restart_both_ways


def tier(resumed: Resumed) -> str:
    """The tier the pods restored from ("nothing": a start from step 0)."""
    tiers = {source or "nothing" for _, source in resumed.restored}
    return "/".join(sorted(tiers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=int, default=10, help="memory snapshot interval")
    parser.add_argument("--kills", default="25,38,45,50,60", help="steps before which rank 1 dies")
    args = parser.parse_args()
    kills = [int(k) for k in args.kills.split(",")]
    rows: list[tuple[int, Resumed, Resumed]] = []
    with tempfile.TemporaryDirectory(prefix="memtier-bench-") as scratch:
        for kill_at in kills:
            kept, recreated = kill_then_restart_both_ways(
                Path(scratch) / f"kill-{kill_at}", memory_interval=args.interval, kill_at=kill_at
            )
            rows.append((kill_at, kept, recreated))
            print(
                f"kill before step {kill_at}: pods kept -> step {kept.planned} from "
                f"{tier(kept)}; recreated -> step {recreated.planned} from {tier(recreated)}",
                flush=True,
            )
    print()
    print(
        f"tiny GPT, 2 pods x 1 rank, torchrun; checkpoints every {CHECKPOINT_INTERVAL} steps, "
        f"memory snapshots every {args.interval}"
    )
    print(f"{'steps done':>10} | {'pods kept (memory tier)':>28} | {'recreated (no memory)':>28}")
    for _, kept, recreated in rows:
        with_memory = f"from {kept.planned:>3} ({tier(kept)}): lost {kept.lost:>2}"
        without = f"from {recreated.planned:>3} ({tier(recreated)}): lost {recreated.lost:>2}"
        print(f"{kept.done_steps:>10} | {with_memory:>28} | {without:>28}")
    lost_kept = [kept.lost for _, kept, _ in rows]
    lost_recreated = [recreated.lost for _, _, recreated in rows]
    print(
        f"steps lost: memory tier max {max(lost_kept)} mean {statistics.mean(lost_kept):.1f} "
        f"(target <= {args.interval}); without max {max(lost_recreated)} mean "
        f"{statistics.mean(lost_recreated):.1f} (up to {CHECKPOINT_INTERVAL})"
    )


if __name__ == "__main__":
    main()
