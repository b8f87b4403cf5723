"""The Lightning and HF Trainer examples as jobs on the local node, and what their ranks logged.

Like support.tinygpt: the manifest is the example's own, changed only where the local node
differs from a cluster (no images: the container runs on this host with the repository as
its working directory). Both examples log the same JSON lines
under the PFS tier, so one checker serves both e2e tests.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from support.operator import Jobs

REPO = Path(__file__).resolve().parents[2]
Json = dict[str, Any]

POISONED_STEPS = range(81, 85)
"""Steps that read shard-0020 in an unskipped run (64 samples per shard, 16 a step)."""
REWARMUP_STEPS = 10


def example_manifest(example: str, name: str) -> Json:
    manifest: Json = copy.deepcopy(
        yaml.safe_load((REPO / "examples" / example / "stabletrainingjob.yaml").read_text())
    )
    manifest["metadata"]["name"] = name
    spec = manifest["spec"]
    spec["workers"]["template"]["spec"]["containers"][0]["workingDir"] = str(REPO)
    return manifest


class ExampleLogs:
    """The JSON lines the example's ranks wrote on the PFS tier (`<shared>/<ns>/pfs/<subdir>`)."""

    def __init__(self, shared_dir: Path, namespace: str, subdir: str) -> None:
        self.directory = shared_dir / namespace / "pfs" / subdir

    def lines(self, attempt: int, rank: int = 0) -> list[Json]:
        path = self.directory / f"attempt-{attempt}-rank-{rank}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def steps(self, attempt: int, rank: int = 0) -> list[Json]:
        return [r for r in self.lines(attempt, rank) if "event" not in r]

    def events(self, attempt: int, rank: int = 0) -> list[Json]:
        return [r for r in self.lines(attempt, rank) if "event" in r]


def check_healed(jobs: Jobs, name: str, logs: ExampleLogs, steps: int = 140) -> Json:
    """The acceptance of a framework example's healing, from status and the run's own log.

    Returns the rollback entry for what the caller wants to print.
    """
    done = jobs.wait(name, lambda s: s.get("phase") in ("Succeeded", "Failed"), 480,
                     "the job to heal")  # fmt: skip
    assert done["phase"] == "Succeeded", done.get("conditions")
    (entry,) = done["rollbackHistory"]
    first, resumed = logs.steps(0), logs.steps(1)
    assert entry["signal"] == "LossSpike"
    onset = entry["onsetStep"]
    assert next(r["step"] for r in first if r["poisoned"]) == onset == POISONED_STEPS[0]
    assert entry["toStep"] == 70, "the newest stable checkpoint >= 10 steps before the onset"
    assert resumed[0]["step"] == entry["toStep"] + 1, "the framework resumed at the chosen step"

    # The LR the optimizer applied (read by its own step pre-hook): the same schedule at half
    # the LR once the re-warm-up is over, ramping up from a tenth of that before.
    lr_before = {r["step"]: r["lr"] for r in first}
    lr_after = {r["step"]: r["lr"] for r in resumed}
    ramp_end = entry["toStep"] + REWARMUP_STEPS
    compared = [s for s in sorted(lr_before) if s > ramp_end and s in lr_after]
    assert compared, "steps after the re-warm-up that both attempts trained"
    for step in compared:
        assert abs(lr_after[step] / lr_before[step] - 0.5) < 1e-6, (step, lr_after[step])
    start = entry["toStep"] + 1
    assert abs(lr_after[start] / lr_before[start] - 0.5 / REWARMUP_STEPS) < 1e-6
    assert {r["lr_scale"] for r in resumed} == {0.5}
    assert done["lrScale"] == 0.5

    # The poisoned data is never read again: not by a step, and not by the loader's
    # prefetching either (the dataset counts what it was asked for, on every rank).
    (skip,) = entry["skipped"]
    assert (skip["first"], skip["last"]) == (onset - 5, onset + 15)
    for rank in (0, 1):
        assert not any(r["poisoned"] for r in logs.steps(1, rank))
        last = logs.events(1, rank)[-1]
        assert (last["event"], last["step"], last["reads"]) == ("done", steps, 0), last
    assert resumed[-1]["step"] == steps
    assert max(r["loss"] for r in resumed) < 1.6 * first[onset - 2]["loss"], "never re-spikes"
    start, stop = logs.events(0)[0]["time"], first[-1]["time"]
    resume, end = logs.events(1)[0]["time"], logs.events(1)[-1]["time"]
    print(
        f"\nattempt 0: {stop - start:.1f} s from the fit's start to step {first[-1]['step']} "
        f"(trip at {entry['fromStep']}); relaunch: {resume - stop:.1f} s to attempt 1's start; "
        f"attempt 1: {end - resume:.1f} s from step {entry['toStep'] + 1} to {steps}"
    )
    return dict(entry)
