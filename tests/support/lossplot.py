"""The picture of a healed run: loss against step, every attempt, with what the operator did.

Drawn from the ranks' own step logs (the cross-rank loss the agent saw) and the job's
status: the pre-spike baseline, the spike the first attempt ran into, the rollback from the
trip back to the checkpoint resumed, and the data range the relaunched run skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: chosen before pyplot is imported

import matplotlib.pyplot as plt

from support.tinygpt import StepLogs, finite

Json = dict[str, Any]
COLOURS = ("tab:red", "tab:blue", "tab:green", "tab:purple")


def plot_recovery(logs: StepLogs, status: Json, out: Path, title: str) -> None:
    figure, axes = plt.subplots(figsize=(11, 5.5), dpi=110)
    for attempt in logs.attempts():
        steps = [r for r in logs.steps(attempt) if finite(r["loss"])]
        axes.plot(
            [r["step"] for r in steps],
            [r["loss"] for r in steps],
            color=COLOURS[attempt % len(COLOURS)],
            linewidth=1.1,
            alpha=0.85,
            label=f"attempt {attempt}" + (" (poisoned shard read)" if attempt == 0 else ""),
        )
    history = status.get("rollbackHistory") or []
    first_attempt = logs.steps(0)
    for number, entry in enumerate(history):
        onset, trip, target = entry.get("onsetStep"), entry["fromStep"], entry.get("toStep")
        before = {r["step"]: r for r in logs.steps(entry["attempt"] - 1 if entry["attempt"] else 0)}
        baseline = next(
            (before[s]["baseline"] for s in sorted(before, reverse=True)
             if onset is not None and s < onset and finite(before[s]["baseline"])),
            None,
        )  # fmt: skip
        if baseline is not None and onset is not None:
            axes.hlines(baseline, 0, onset, colors="black", linestyles="dashed", linewidth=1)
            axes.hlines([1.1 * baseline], 0, trip, colors="grey", linestyles="dotted", linewidth=1)
            # Each line labelled on its own side, at the start: the loss curve is still far
            # above both there, and a label above the dotted line sat on it.
            axes.annotate(
                f"pre-spike baseline {baseline:.2f}",
                (0, baseline),
                xytext=(4, -4),
                textcoords="offset points",
                va="top",
                fontsize=8,
            )
            axes.annotate(
                "baseline +10%",
                (0, 1.1 * baseline),
                xytext=(4, 3),
                textcoords="offset points",
                va="bottom",
                fontsize=8,
                color="dimgrey",
            )
        if onset is not None:
            axes.axvline(onset, color="orange", linewidth=1, label=f"spike onset, step {onset}")
        if target is not None:
            peak = max((r["loss"] for r in first_attempt if finite(r["loss"])), default=1.0)
            axes.annotate(
                "",
                xy=(target, peak * (0.9 - 0.08 * number)),
                xytext=(trip, peak * (0.9 - 0.08 * number)),
                arrowprops={"arrowstyle": "->", "color": "black", "linewidth": 1.4},
            )
            axes.text(
                (target + trip) / 2,
                peak * (0.92 - 0.08 * number),
                f"rollback {number + 1}: step {trip} -> {target}, LR x{entry['lrScale']:g}",
                ha="center",
                fontsize=9,
            )
        for skipped in entry.get("skipped") or []:
            axes.axvspan(
                skipped["first"],
                skipped["last"],
                color="grey",
                alpha=0.15,
                label=f"skipped: {skip_label(skipped)}",
            )
    axes.set_xlabel("global step")
    axes.set_ylabel("training loss (mean over ranks)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper right", fontsize=8)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    plt.close(figure)


def skip_label(skipped: dict[str, Any]) -> str:
    """A status skip range as the legend says it: the shards it names, or the whole range."""
    steps = f"the data of steps {skipped['first']}-{skipped['last']}"
    shards = skipped.get("shardIds") or []
    return f"{', '.join(shards)} in {steps}" if shards else steps
