"""The tiny-GPT example as a job on the local node: its manifest, and what its ranks logged.

The manifest is the example's own `stabletrainingjob.yaml`, changed only where the local
node differs from a cluster: there are no images, so the container runs on this host's
filesystem with the repository as its working directory.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tiny-gpt"
MANIFEST = EXAMPLE / "stabletrainingjob.yaml"
LOG_SUBDIR = "tiny-gpt-log"
"""Where train.py writes its per-step lines, under the PFS tier (train.LOG_SUBDIR)."""
SHARD_SAMPLES = 256
GLOBAL_BATCH = 16
"""train.py's defaults: 256 sequences per shard, 2 ranks x 8 per step."""
Json = dict[str, Any]


def shard_batches(shard_index: int) -> range:
    """Global batch indices a shard fills when nothing is skipped (batch b = step b + 1)."""
    per_shard = SHARD_SAMPLES // GLOBAL_BATCH
    return range(shard_index * per_shard, (shard_index + 1) * per_shard)


def job_manifest(
    name: str,
    env: Mapping[str, str | None] = {},
    *,
    recovery: Json | None = None,
    detection: Json | None = None,
) -> Json:
    """The example's job named `name`; `env` overrides its variables (None removes one)."""
    manifest: Json = copy.deepcopy(yaml.safe_load(MANIFEST.read_text()))
    manifest["metadata"]["name"] = name
    spec = manifest["spec"]
    container = spec["workers"]["template"]["spec"]["containers"][0]
    container["workingDir"] = str(REPO)
    variables = {e["name"]: e["value"] for e in container.get("env", [])}
    variables.update(env)
    container["env"] = [{"name": k, "value": v} for k, v in variables.items() if v is not None]
    if recovery is not None:
        spec["recovery"] = recovery
    if detection is not None:
        spec["detection"] = detection
    return manifest


class StepLogs:
    """The JSON lines train.py's ranks wrote on the PFS tier (`<shared>/<ns>/pfs/...`)."""

    def __init__(self, shared_dir: Path, namespace: str, claim: str = "pfs") -> None:
        self.directory = shared_dir / namespace / claim / LOG_SUBDIR

    def lines(self, attempt: int, rank: int = 0) -> list[Json]:
        path = self.directory / f"attempt-{attempt}-rank-{rank}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def steps(self, attempt: int, rank: int = 0) -> list[Json]:
        """Only the per-step records (not start/done/tripped), in order."""
        return [r for r in self.lines(attempt, rank) if "event" not in r]

    def events(self, attempt: int, rank: int = 0) -> list[Json]:
        return [r for r in self.lines(attempt, rank) if "event" in r]

    def attempts(self) -> list[int]:
        found = {int(p.name.split("-")[1]) for p in self.directory.glob("attempt-*-rank-0.jsonl")}
        return sorted(found)

    def curve(self) -> list[Json]:
        """Every step of every attempt, oldest attempt first: what a loss plot shows."""
        return [record for attempt in self.attempts() for record in self.steps(attempt)]


def clean_batches_passed_over(attempt_steps: list[list[Json]], poisoned: set[str]) -> float:
    """Clean data an attempt never read between its first and its last sample read, in
    global batches: what its skip list threw away besides the poisoned shards.

    `attempt_steps` holds every rank's step records of one attempt (train.py logs each
    batch's sample ranges). Positions count samples of the shards laid end to end, so a
    shard passed over and a batch skipped whole both show up as positions never read.
    """
    read: set[int] = set()
    for steps in attempt_steps:
        for record in steps:
            for shard, start, stop in record["samples"]:
                base = int(shard.split("-")[1]) * SHARD_SAMPLES
                read.update(range(base + start, base + stop))
    if not read:
        return 0.0
    passed = set(range(min(read), max(read) + 1)) - read
    clean = [p for p in passed if f"shard-{p // SHARD_SAMPLES:04d}" not in poisoned]
    return len(clean) / GLOBAL_BATCH


def finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def write_replay_csv(logs: StepLogs, path: Path) -> int:
    """The agent's per-step view of every attempt in `stabletrain replay`'s format (see
    docs/cli.md): the cross-rank loss, grad norm and LR the agent saw, with attempt and time.
    Returns the rows written."""
    rows = ["step,loss,grad_norm,lr,attempt,time"]
    for record in logs.curve():
        cells = [record["step"], record["loss"], record["grad_norm"], record["lr"]]
        text = ["" if v is None else ("nan" if not finite(v) else repr(v)) for v in cells]
        rows.append(",".join([*text, str(record["attempt"]), f"{record['time']:.3f}"]))
    path.write_text("\n".join(rows) + "\n")
    return len(rows) - 1


def expected_decisions(status: Json, rules: list[Json]) -> list[Json]:
    """The decisions the live operator took, from `status.rollbackHistory`, in the replay
    agreement format (tests/unit/cli/replay_agreement/README.md)."""
    actions = {rule["name"]: rule["action"] for rule in rules}
    return [
        {
            "step": entry["fromStep"],
            "signal": entry["signal"],
            "action": actions[entry["rule"]],
            "rule": entry["rule"],
            "onset": entry.get("onsetStep"),
        }
        for entry in status.get("rollbackHistory") or []
    ]
