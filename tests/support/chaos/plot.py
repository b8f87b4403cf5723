"""The picture of a chaos run: loss against step and against wall time, clean and chaos
runs together, every fault and every recovery marked, the ETTR in the title."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: chosen before pyplot is imported

import matplotlib.pyplot as plt

from support.chaos.measure import Incident
from support.chaos.run import Applied, RunResult
from support.tinygpt import finite

KIND_COLOURS = {
    "spike": "tab:orange", "nan": "tab:red", "kill": "tab:purple", "hang": "tab:brown",
    "lost-node": "tab:pink", "pfs-readonly": "tab:olive", "operator-kill": "tab:cyan",
    "corrupt-checkpoint": "black", "apiserver-restart": "tab:gray",
}  # fmt: skip


def plot_chaos(
    clean: RunResult,
    chaos: RunResult,
    *,
    applied: Sequence[Applied],
    found: Sequence[Incident],
    ettr: float,
    out: Path,
) -> None:
    figure, (by_step, by_time) = plt.subplots(2, 1, figsize=(12, 8.5), dpi=110)
    curve = [r for r in clean.logs.curve() if finite(r["loss"])]
    by_step.plot([r["step"] for r in curve], [r["loss"] for r in curve], color="tab:green",
                 linewidth=0.9, alpha=0.8, label="clean run")  # fmt: skip
    by_time.plot([r["time"] - clean.created_at for r in curve], [r["loss"] for r in curve],
                 color="tab:green", linewidth=0.9, alpha=0.8, label="clean run")  # fmt: skip
    for number, attempt in enumerate(chaos.logs.attempts()):
        steps = [r for r in chaos.logs.steps(attempt) if finite(r["loss"])]
        label = "chaos run (one shade per attempt)" if number == 0 else None
        shade = "tab:blue" if number % 2 == 0 else "tab:cyan"
        by_step.plot([r["step"] for r in steps], [r["loss"] for r in steps], color=shade,
                     linewidth=0.9, alpha=0.8, label=label)  # fmt: skip
        by_time.plot([r["time"] - chaos.created_at for r in steps], [r["loss"] for r in steps],
                     color=shade, linewidth=0.9, alpha=0.8, label=label)  # fmt: skip
    top = max((r["loss"] for r in curve), default=5.0)
    seen: set[str] = set()
    for item in applied:
        if item.injected is None:
            continue
        kind = item.planned.kind
        at = item.injected.at - chaos.created_at
        colour = KIND_COLOURS.get(kind, "black")
        by_time.axvline(at, color=colour, linewidth=1.2, linestyle="--",
                        label=None if kind in seen else f"fault: {kind}")  # fmt: skip
        by_time.annotate(f"#{item.planned.index}", (at, top * 0.97), fontsize=7, color=colour)
        step = _step_at(chaos, item.injected.at)
        if step is not None:
            by_step.axvline(step, color=colour, linewidth=1.2, linestyle="--",
                            label=None if kind in seen else f"fault: {kind}")  # fmt: skip
        seen.add(kind)
    for number, incident in enumerate(found):
        if incident.stopping_at is None or incident.first_step_at is None:
            continue
        label = "recovery: Stopping -> first resumed step" if number == 0 else None
        by_time.axvspan(incident.stopping_at - chaos.created_at,
                        incident.first_step_at - chaos.created_at, color="red", alpha=0.12,
                        label=label)  # fmt: skip
        if incident.reached_step is not None and incident.restored_step is not None:
            height = top * (0.9 - 0.04 * (number % 5))
            arrow = {"arrowstyle": "->", "color": "red", "linewidth": 1.1}
            by_step.annotate("", xy=(incident.restored_step, height),
                             xytext=(incident.reached_step, height), arrowprops=arrow)  # fmt: skip
    by_step.set_xlabel("global step (red arrows: where each recovery resumed)")
    by_time.set_xlabel("seconds since the job was created (shaded: recoveries)")
    for axes in (by_step, by_time):
        axes.set_ylabel("training loss (mean over ranks)")
        axes.grid(alpha=0.3)
        axes.legend(loc="upper right", fontsize=7, ncol=2)
    figure.suptitle(
        f"tiny GPT under chaos: {sum(a.injected is not None for a in applied)} faults, "
        f"{len(found)} recoveries, ETTR {ettr:.1%}"
    )
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    plt.close(figure)


def _step_at(run: RunResult, at: float) -> int | None:
    """The last step logged before `at` (any attempt)."""
    before = [(r["time"], r["step"]) for r in run.logs.curve() if r["time"] <= at]
    return int(max(before)[1]) if before else None
