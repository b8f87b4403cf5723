"""`--plot`: loss, its healthy baseline and the decisions, so a person can check the policy
by eye before trusting it on a live run."""

from __future__ import annotations

import math
from pathlib import Path

from stabletrain_contract.names import Action
from stabletrain_operator.cli.errors import CliError
from stabletrain_operator.cli.replay.replay_loop import ReplayResult
from stabletrain_operator.finite import finite_or
from stabletrain_operator.policy.action_registry import kind_of


def write_plot(result: ReplayResult, out: Path, *, title: str) -> None:
    """A PNG at `out`; CliError if matplotlib is missing or the file cannot be written."""
    try:
        import matplotlib  # noqa: PLC0415  (optional extra, only needed for --plot)

        matplotlib.use("Agg")
        from matplotlib import pyplot  # noqa: PLC0415
    except ImportError:
        raise CliError("--plot needs matplotlib: pip install 'stabletrain[plot]'") from None
    figure, axes = pyplot.subplots(figsize=(11, 4.5), dpi=110)
    try:
        attempts = sorted({p.attempt for p in result.points})
        loss_label = "loss (earlier attempts faded)" if len(attempts) > 1 else "loss"
        for attempt in attempts:
            points = [p for p in result.points if p.attempt == attempt]
            steps = [p.step for p in points]
            fade = 0.45 if attempt != attempts[-1] else 1.0
            first = attempt == attempts[0]
            axes.plot(
                steps,
                [finite_or(p.loss, math.nan) for p in points],
                lw=0.8,
                color="tab:blue",
                alpha=fade,
                label=loss_label if first else None,
            )
            axes.plot(
                steps,
                [math.nan if p.baseline is None else p.baseline for p in points],
                lw=1.2,
                ls="--",
                color="tab:green",
                alpha=fade,
                label="healthy baseline" if first else None,
            )
        non_finite = [p.step for p in result.points if not math.isfinite(p.loss)]
        if non_finite:
            axes.scatter(
                non_finite,
                [axes.get_ylim()[1]] * len(non_finite),
                marker="x",
                color="black",
                label="non-finite loss",
            )
        seen: set[Action] = set()
        for replayed in result.decisions:
            action = replayed.decision.action
            axes.axvline(
                replayed.step,
                color=kind_of(action).plot_colour,
                lw=1.0,
                label=None if action in seen else f"{action.value}",
            )
            seen.add(action)
            axes.annotate(
                f"{action.value} ({replayed.decision.signal})",
                (replayed.step, axes.get_ylim()[1]),
                rotation=90,
                va="top",
                ha="right",
                fontsize=7,
            )
        axes.set_xlabel("step")
        axes.set_ylabel("loss")
        axes.set_title(title, fontsize=9)
        axes.legend(loc="upper right", fontsize=8)
        figure.tight_layout()
        try:
            figure.savefig(out, format="png")
        except OSError as error:
            raise CliError(f"cannot write the plot to {out}: {error.strerror}") from None
    finally:
        pyplot.close(figure)
