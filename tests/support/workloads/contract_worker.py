"""A torch-free stand-in for a training script that speaks the trainer-agent's contracts.

Run under torchrun in the operator's pods. It uses the real agent pieces the operator talks
to (DirectiveSource, SignalMonitor, AgentExporter, the trip report), over a synthetic loss
curve, so operator tests run in seconds with every fault chosen exactly:

- ST_STEPS (total steps), ST_STEP_SECONDS (sleep per step), ST_CKPT_EVERY (save interval)
- ST_NAN_AT: the loss is NaN from this step on (attempt ST_FAULT_ATTEMPT only, default 0)
- ST_SPIKE_AT/ST_SPIKE_LEN/ST_SPIKE_FACTOR: the data of these steps spikes the loss, unless
  the directives skip them (what a poisoned shard does)
- ST_TRANSIENT_AT: a two-step loss blip at this step (shorter than any sustained rule)
- ST_GRAD_SPIKE_AT/ST_GRAD_SPIKE_LEN: a report-only grad-norm spike
- ST_NO_PFS_STEPS: comma-separated save steps whose PFS copy is never written
- ST_LOST_AFTER_TRIP: comma-separated save steps removed from both tiers just after the trip
  report listed them (retention or a tier losing them while the operator plans)

Checkpoints are real files, one per rank: `<local>/step-N/rank-R.json` on the node's tier
and `<pfs>/step-N/rank-R.json` on the shared one, written atomically; the inventory is read
back from disk every step, so a missing PFS copy is missing because no file is there. Each
step appends a JSON line to `<pfs>/log/attempt-<a>-rank-<r>.jsonl` for the test to read.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.endpoint.exporter import AgentExporter
from stabletrain_agent.run_end.trip_exit import write_termination_message
from stabletrain_contract import env
from stabletrain_contract.checkpoint.inventory import (
    CheckpointRecord,
    NodeCopy,
    TierCopy,
    compact_inventory,
)
from stabletrain_contract.directives import Directives, SkipRange
from stabletrain_contract.restore import RESTORE_EXIT_CODE, render_restore_failure
from stabletrain_contract.signals.monitor import SignalMonitor, StepObservation
from stabletrain_contract.signals.trip_report_builder import build_trip_report


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


def _in_skip(step: int, skip: Sequence[SkipRange]) -> bool:
    return any(r.first <= step <= r.last for r in skip)


def lr_factor(directives: Directives, step: int) -> float:
    """The factor on the scheduled LR at global `step`: what the guard's LrScale applies
    (stabletrain_agent/lr.py) once it adopted `directives`, re-warm-up included. This worker
    is torch-free and lr.py is not, so the arithmetic is repeated here;
    tests/torch/test_guard_lr.py checks that the two agree.

    A checkpoint of step S holds the state after S steps, so the first step run after
    resuming is S + 1: it gets lr_scale / rewarmup_steps, step S + rewarmup_steps and later
    the full lr_scale.
    """
    if directives.resume_step is None or directives.rewarmup_steps == 0:
        return directives.lr_scale
    into_ramp = max(step - directives.resume_step, 1)
    return (
        directives.lr_scale * min(into_ramp, directives.rewarmup_steps) / directives.rewarmup_steps
    )


def _write_atomic(path: Path, data: bytes) -> None:
    """Readers (the other rank's inventory scan on the same node) never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def _save(local: Path, pfs: Path, step: int, *, attempt: int, rank: int, no_pfs: set[int]) -> None:
    record = json.dumps({"step": step, "attempt": attempt, "rank": rank}).encode()
    _write_atomic(local / f"step-{step}" / f"rank-{rank}.json", record)
    if step not in no_pfs:
        _write_atomic(pfs / f"step-{step}" / f"rank-{rank}.json", record)


def _inventory(local: Path, pfs: Path, node: str, ranks: int) -> list[CheckpointRecord]:
    """Checkpoints on this node's tier; complete on the PFS once every rank's part is there."""
    records = []
    for directory in sorted(local.glob("step-*")):
        parts = sorted(directory.glob("rank-*.json"))
        if not parts:
            continue
        state = json.loads(parts[0].read_text())
        complete = len(list((pfs / directory.name).glob("rank-*.json"))) >= ranks
        records.append(
            CheckpointRecord(
                step=int(directory.name.split("-")[1]),
                attempt=state["attempt"],
                stable=True,
                saved_at=datetime.fromtimestamp(parts[0].stat().st_mtime, UTC),
                pfs=TierCopy(complete=complete, verified=complete),
                local=(NodeCopy(node=node, complete=True, verified=True),),
            )
        )
    return sorted(records, key=lambda r: r.step)


def main() -> int:
    attempt = _int(env.ATTEMPT, 0)
    node = os.environ.get(env.NODE_NAME, "local")
    ranks = _int(env.WORLD_SIZE, 1)
    rank = _int(env.RANK, 0)
    local = Path(os.environ.get(env.LOCAL_CHECKPOINT_DIR, "/tmp/local"))
    pfs = Path(os.environ.get(env.PFS_CHECKPOINT_DIR, "/tmp/pfs"))
    steps = _int("ST_STEPS", 60)
    pause = float(os.environ.get("ST_STEP_SECONDS", "0.1"))
    every = _int("ST_CKPT_EVERY", 5)
    fault_attempt = _int("ST_FAULT_ATTEMPT", 0)
    nan_at = _int("ST_NAN_AT", -1)
    spike_at, spike_len = _int("ST_SPIKE_AT", -1), _int("ST_SPIKE_LEN", 0)
    spike_factor = float(os.environ.get("ST_SPIKE_FACTOR", "3.0"))
    grad_at, grad_len = _int("ST_GRAD_SPIKE_AT", -1), _int("ST_GRAD_SPIKE_LEN", 0)
    transient_at = _int("ST_TRANSIENT_AT", -1)
    no_pfs = {int(s) for s in os.environ.get("ST_NO_PFS_STEPS", "").split(",") if s}
    lost = {int(s) for s in os.environ.get("ST_LOST_AFTER_TRIP", "").split(",") if s}

    source = DirectiveSource.from_env()
    directives = source.latest()
    if directives is None:
        print("contract_worker: no directives in the environment", file=sys.stderr)
        return 2
    exporter = AgentExporter.from_env(source)
    if exporter is not None:
        exporter.start()
    monitor = SignalMonitor(directives.detection, directives.trip_on, directives.trip_rules)
    log_dir = pfs / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = (log_dir / f"attempt-{attempt}-rank-{rank}.jsonl").open("a", encoding="utf-8")
    start = directives.resume_step or 0
    if start and not (pfs / f"step-{start}" / f"rank-{rank}.json").exists():
        message = render_restore_failure(start, attempt, "its PFS copy is missing")
        if _int(env.LOCAL_RANK, 0) == 0:
            Path(os.environ[env.TERMINATION_MESSAGE_PATH]).write_text(message)
        print(f"contract_worker: {message}", file=sys.stderr)
        return RESTORE_EXIT_CODE
    applied = directives
    answered = directives.save_request
    try:
        for step in range(start + 1, steps + 1):
            latest = source.latest() or applied
            if latest.generation != applied.generation:
                monitor.reconfigure(latest.detection, latest.trip_on, latest.trip_rules)
                applied = latest
            faulty = attempt == fault_attempt
            loss = 1.0 + 2.0 * math.exp(-step / 50.0) + 0.01 * math.sin(step)
            grad_norm = 1.0 + 0.01 * math.cos(step)
            if spike_at <= step < spike_at + spike_len and not _in_skip(step, applied.skip):
                loss *= spike_factor
            if transient_at <= step < transient_at + 2:
                loss *= spike_factor
            if faulty and nan_at >= 0 and step >= nan_at:
                loss = float("nan")
            if grad_at <= step < grad_at + grad_len:
                grad_norm *= 10.0
            lr = 0.1 * lr_factor(applied, step)
            verdict = monitor.observe(
                StepObservation(
                    step=step, loss=loss, grad_norm=grad_norm, lr=lr, tokens_per_second=1000.0,
                    checkpoint_in_flight=False, steps_since_start=step - start - 1,
                )
            )  # fmt: skip
            if exporter is not None:
                exporter.update(
                    monitor.snapshot(),
                    lr_scale=applied.lr_scale,
                    applied_generation=applied.generation,
                )
            entry = {"step": step, "loss": loss, "lr": lr, "lrScale": applied.lr_scale,
                     "generation": applied.generation, "time": time.time()}  # fmt: skip
            log.write(json.dumps(entry) + "\n")
            log.flush()
            if verdict.trip:
                records = _inventory(local, pfs, node, ranks)
                report = build_trip_report(
                    verdict,
                    attempt=attempt,
                    node=node,
                    last_good_step=monitor.last_good_step,
                    inventory=compact_inventory(records, node),
                    lineage_path="",
                )
                if exporter is not None:
                    exporter.record_trip(report)
                write_termination_message(Path(os.environ[env.TERMINATION_MESSAGE_PATH]), report)
                for gone in lost:
                    for tier in (local, pfs):
                        (tier / f"step-{gone}" / f"rank-{rank}.json").unlink(missing_ok=True)
                print(f"contract_worker: tripped at step {step}: {report.signal}", file=sys.stderr)
                return 1
            requested = applied.save_request > answered
            if step % every == 0 or requested:
                _save(local, pfs, step, attempt=attempt, rank=rank, no_pfs=no_pfs)
            if exporter is not None:
                exporter.set_inventory(_inventory(local, pfs, node, ranks))
            if requested:  # before a suspend: a checkpoint now, on both tiers, reported
                answered = applied.save_request
                if exporter is not None:
                    exporter.set_saved(answered, step)
            time.sleep(pause)
    finally:
        log.close()
        if exporter is not None:
            exporter.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
