"""The guard in a single process: syncs per step, NaN never reaching weights, trips, scaler."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from stabletrain_agent.checkpoint.replicate import PfsCondition
from stabletrain_agent.data import Shard, ShardedBatches
from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.endpoint.exporter import AgentExporter
from stabletrain_agent.guard import Guard, GuardEnv
from stabletrain_agent.run_end.trip_exit import TRIP_EXIT_CODE, TrainingTripped
from stabletrain_contract.channel import AgentStatus, RejectedCopy
from stabletrain_contract.checkpoint.inventory import CheckpointRecord, TierCopy
from stabletrain_contract.checkpoint.settings import CheckpointSettings
from stabletrain_contract.completion import parse_completion
from stabletrain_contract.detection import BaselineConfig, DetectionConfig, NonFiniteConfig
from stabletrain_contract.directives import Directives, SkipRange, SkipUnit
from stabletrain_contract.names import Signal
from stabletrain_contract.signals.monitor import MonitorSnapshot
from stabletrain_contract.trip_report import parse_termination_message

BLOCK = 16
VOCAB = 32


def token_batches(batch_size: int = 4) -> ShardedBatches[torch.Tensor, torch.Tensor]:
    """Deterministic token shards; every sample is BLOCK + 1 tokens (inputs and targets)."""

    def read(shard_id: str, start: int, stop: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(hash(shard_id) % 10_000)
        samples = torch.randint(0, VOCAB, (64, BLOCK + 1), generator=generator)
        return samples[start:stop]

    shards = [Shard(f"shard-{i}", 64) for i in range(4)]
    return ShardedBatches(shards, read, torch.cat, batch_size=batch_size)


def tiny_model(tiny_gpt: ModuleType) -> nn.Module:
    torch.manual_seed(0)
    config = tiny_gpt.GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=1, n_head=2, n_embd=32)
    model: nn.Module = tiny_gpt.TinyGPT(config)
    return model


def directives(**detection: Any) -> DirectiveSource:
    return DirectiveSource(
        0, Directives(generation=1, attempt=0, detection=DetectionConfig(**detection))
    )


class RecordedCheckpoints:
    """The manager's trip-time interface, recording what the guard asked of it."""

    def __init__(self) -> None:
        self.flushed: list[tuple[float, int | None]] = []
        self.snapshots: list[tuple[int, bool]] = []
        self.settings: list[CheckpointSettings] = []

    def inventory(self) -> list[CheckpointRecord]:
        return [
            CheckpointRecord(
                step=5,
                attempt=0,
                stable=True,
                saved_at=datetime.now(UTC),
                pfs=TierCopy(complete=True, verified=True),
            )
        ]

    def rejected(self) -> tuple[RejectedCopy, ...]:
        return ()

    def flush(self, deadline_s: float, before_step: int | None = None) -> None:
        self.flushed.append((deadline_s, before_step))

    def is_save_step(self, step: int) -> bool:
        return step % 2 == 0

    def snapshot(self, step: int, *, stable: bool) -> bool:
        self.snapshots.append((step, stable))
        return True

    def apply_settings(self, settings: CheckpointSettings) -> None:
        self.settings.append(settings)

    @property
    def inventory_version(self) -> int:
        return 0

    @property
    def pfs_condition(self) -> PfsCondition:
        return PfsCondition()

    @property
    def replicating(self) -> tuple[int, ...] | None:
        return None

    @property
    def restored_at(self) -> datetime | None:
        return None


def params_finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


@pytest.mark.parametrize("optimizer_name", ["SGD", "AdamW"])
def test_at_most_one_host_sync_per_step(
    tiny_gpt: ModuleType, sync_counter: Any, optimizer_name: str
) -> None:
    steps = 12

    def train(guarded: bool) -> int:
        model = tiny_model(tiny_gpt)
        optimizer: torch.optim.Optimizer
        if optimizer_name == "SGD":
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
        batches = token_batches()
        guard = Guard(
            model,
            optimizer,
            scheduler=scheduler,
            data=batches,
            directives=DirectiveSource(0),
            guard_env=GuardEnv(),
        )
        sync_counter.reset()
        for _ in range(steps):
            batch = next(batches)
            loss = model(batch[:, :-1], batch[:, 1:])
            loss.backward()
            if guarded:
                guard.step(loss, tokens=batch[:, :-1].numel())
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
            optimizer.zero_grad()
        total: int = sync_counter.total
        return total

    bare = train(guarded=False)
    guarded = train(guarded=True)
    print(f"{optimizer_name}: syncs per step bare={bare / steps} guarded={guarded / steps}")
    assert guarded - bare <= steps
    if optimizer_name == "SGD":
        assert bare == 0
        assert guarded == steps


def test_a_non_finite_step_is_skipped_and_counted_without_tripping(tiny_gpt: ModuleType) -> None:
    model = tiny_model(tiny_gpt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = token_batches()
    guard = Guard(model, optimizer, data=batches, directives=directives(), guard_env=GuardEnv())
    for step in range(1, 9):
        batch = next(batches)
        loss = model(batch[:, :-1], batch[:, 1:])
        if step == 5:
            loss = loss * float("nan")
        loss.backward()
        before = [p.detach().clone() for p in model.parameters()]
        verdict = guard.step(loss)
        optimizer.zero_grad()
        moved = any(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
        assert moved == (step != 5)
        assert ({f.signal for f in verdict.findings} == {Signal.NON_FINITE}) == (step == 5)
        assert params_finite(model)
    assert guard.skipped_steps == 1
    assert guard.global_step == 8


def train_with_inf_loss_from_step_6(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: ShardedBatches[torch.Tensor, torch.Tensor],
    guard: Guard,
) -> None:
    for step in range(1, 20):
        batch = next(batches)
        loss = model(batch[:, :-1], batch[:, 1:])
        if step >= 6:
            loss = loss * float("inf")
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()


def tripped_on_inf_loss(
    tiny_gpt: ModuleType, env: GuardEnv, checkpoints: RecordedCheckpoints | None = None
) -> tuple[Guard, nn.Module, TrainingTripped]:
    """A guard that trips on the second non-finite step (the loss is inf from step 6)."""
    model = tiny_model(tiny_gpt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = token_batches()
    guard = Guard(
        model,
        optimizer,
        data=batches,
        directives=directives(non_finite=NonFiniteConfig(consecutive_steps=2)),
        guard_env=env,
        checkpoints=checkpoints,
    )
    with pytest.raises(TrainingTripped) as tripped:
        train_with_inf_loss_from_step_6(model, optimizer, batches, guard)
    return guard, model, tripped.value


def test_a_pfs_that_refuses_the_lineage_does_not_end_training(
    tiny_gpt: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refusing = tmp_path / "pfs"
    refusing.write_text("a file where the PFS's directory should be: every mkdir fails")
    env = GuardEnv(termination_path=tmp_path / "termination-log", lineage_root=refusing / "lineage")
    _, _, tripped = tripped_on_inf_loss(tiny_gpt, env)  # not an OSError from the lineage write
    report = tripped.report
    assert (report.step, report.onset_step, report.signal) == (7, 6, Signal.NON_FINITE)
    assert report.suspect_shards == ("shard-0",)
    assert report.lineage_path == ""
    assert "lineage of the spike window at step 6 not written to" in capsys.readouterr().err


def test_a_trip_stops_with_the_report_and_the_lineage(tiny_gpt: ModuleType, tmp_path: Path) -> None:
    termination = tmp_path / "termination-log"
    checkpoints = RecordedCheckpoints()
    env = GuardEnv(
        attempt=0,
        node="node-a",
        pod="pod-a",
        termination_path=termination,
        lineage_root=tmp_path / "lineage",
    )
    guard, model, tripped = tripped_on_inf_loss(tiny_gpt, env, checkpoints)
    assert tripped.code == TRIP_EXIT_CODE
    assert guard.global_step == 7
    assert params_finite(model)
    report = parse_termination_message(termination.read_text())
    assert (report.step, report.onset_step, report.signal) == (7, 6, Signal.NON_FINITE)
    assert (report.node, report.pod) == ("node-a", "pod-a")
    assert report.inventory == ((5, 0, 13),)
    # The memory tier is offered every healthy step, never one with a finding (6, 7).
    assert checkpoints.snapshots == [(step, True) for step in range(1, 6)]
    assert report.suspect_shards == ("shard-0",)
    assert checkpoints.flushed == [(60.0, 6)]
    assert len(termination.read_bytes()) <= 4096
    lineage = json.loads((Path(report.lineage_path) / "rank-0.json").read_text())
    assert [entry["step"] for entry in lineage["steps"]] == list(range(1, 8))
    assert lineage["steps"][5] == {
        "step": 6,
        "batchIndex": 5,
        "ranges": [{"shardId": "shard-0", "start": 20, "stop": 24}],
    }


class PublishedStatuses(AgentExporter):
    """The real exporter, keeping the status each published step would be scraped as."""

    def __init__(self) -> None:
        super().__init__(source=directives(), token="t", node="node-a", node_rank=0)
        self.published: list[AgentStatus] = []

    def update(
        self, snapshot: MonitorSnapshot, *, lr_scale: float, applied_generation: int
    ) -> None:
        super().update(snapshot, lr_scale=lr_scale, applied_generation=applied_generation)
        self.published.append(self.status())


def test_no_scrape_sees_the_tripping_finding_before_the_trip_report(tiny_gpt: ModuleType) -> None:
    """Before: the tripping step was published before the report, so a scrape in between
    decided from the finding alone, without the report's suspect shards (CI stop 22).
    After: the step that trips is published with its report."""
    model = tiny_model(tiny_gpt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = token_batches()
    exporter = PublishedStatuses()
    guard = Guard(
        model,
        optimizer,
        data=batches,
        directives=directives(non_finite=NonFiniteConfig(consecutive_steps=2)),
        guard_env=GuardEnv(node="node-a"),
        exporter=exporter,
    )
    with pytest.raises(TrainingTripped):
        train_with_inf_loss_from_step_6(model, optimizer, batches, guard)
    last = exporter.published[-1]
    assert (last.step, last.latest_trip is not None) == (7, True)
    assert last.latest_trip is not None
    assert last.latest_trip.suspect_shards == ("shard-0",)
    for status in exporter.published:
        sustained = any(f.sustained for f in status.firing)
        assert not sustained or status.latest_trip is not None, status.step


def test_gradscaler_overflow_is_routine_not_a_non_finite_event(tiny_gpt: ModuleType) -> None:
    model = tiny_model(tiny_gpt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    batches = token_batches()
    guard = Guard(
        model,
        optimizer,
        scaler=scaler,
        data=batches,
        directives=directives(non_finite=NonFiniteConfig(consecutive_steps=1)),
        guard_env=GuardEnv(),
    )
    overflow_steps = 0
    for _ in range(40):
        batch = next(batches)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(batch[:, :-1], batch[:, 1:])
        scaler.scale(loss).backward()
        before = [p.detach().clone() for p in model.parameters()]
        verdict = guard.step(loss)
        optimizer.zero_grad()
        moved = any(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
        assert Signal.NON_FINITE not in {f.signal for f in verdict.findings}
        overflow_steps += not moved
        assert params_finite(model)
    assert overflow_steps >= 3
    assert guard.skipped_steps == overflow_steps
    assert scaler.get_scale() < 2.0**40
    assert overflow_steps < 40


def test_guard_state_round_trips_the_data_cursor_and_step(tiny_gpt: ModuleType) -> None:
    model = tiny_model(tiny_gpt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = token_batches()
    guard = Guard(model, optimizer, data=batches, directives=directives(), guard_env=GuardEnv())
    for _ in range(3):
        batch = next(batches)
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()
    state = guard.state_dict()
    expected_next = next(batches)

    fresh_batches = token_batches()
    fresh = Guard(
        model, optimizer, data=fresh_batches, directives=directives(), guard_env=GuardEnv()
    )
    fresh.load_state_dict(state)
    assert fresh.global_step == 3
    assert torch.equal(next(fresh_batches), expected_next)
    assert not math.isnan(fresh.lr.factor(4))


def test_a_rollback_resume_never_reads_the_skipped_steps_or_shards(
    tiny_gpt: ModuleType, tmp_path: Path
) -> None:
    def train(
        guard: Guard, model: nn.Module, batches: ShardedBatches[Any, Any], steps: int
    ) -> None:
        for _ in range(steps):
            batch = next(batches)
            model(batch[:, :-1], batch[:, 1:]).backward()
            guard.step(model(batch[:, :-1], batch[:, 1:]).detach().requires_grad_())
            guard.optimizer.zero_grad()

    model = tiny_model(tiny_gpt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = token_batches(batch_size=8)
    guard = Guard(model, optimizer, data=batches, directives=directives(), guard_env=GuardEnv())
    train(guard, model, batches, 3)
    torch.save({"guard": guard.state_dict()}, tmp_path / "step-3.pt")
    train(guard, model, batches, 4)
    tripped_window = {entry.step: entry.batch for entry in guard.lineage.window()}

    rollback = Directives(
        generation=2,
        attempt=0,
        resume_step=3,
        lr_scale=0.5,
        skip=(
            SkipRange(first=4, last=5, unit=SkipUnit.STEP),
            SkipRange(first=0, last=1000, unit=SkipUnit.BATCH, shard_ids=("shard-2",)),
        ),
    )
    resumed_batches = token_batches(batch_size=8)
    resumed = Guard(
        model,
        optimizer,
        data=resumed_batches,
        directives=DirectiveSource(0, rollback),
        guard_env=GuardEnv(),
    )
    resumed.load_state_dict(torch.load(tmp_path / "step-3.pt", weights_only=False)["guard"])
    train(resumed, model, resumed_batches, 20)

    read = list(resumed_batches.read_log)
    skipped_batches = {tripped_window[4].batch_index, tripped_window[5].batch_index}
    assert skipped_batches == {3, 4}
    never = {
        (r.shard_id, i)
        for s in (4, 5)
        for r in tripped_window[s].ranges
        for i in range(r.start, r.stop)
    }
    assert never.isdisjoint((r.shard_id, i) for r in read for i in range(r.start, r.stop))
    assert all(r.shard_id != "shard-2" for r in read)
    assert any(r.shard_id == "shard-3" for r in read), "the run never got past shard-2"
    consumed = [entry.batch.batch_index for entry in resumed.lineage.window()]
    assert consumed[:3] == [3 + 2, 3 + 3, 3 + 4]
    assert 3 not in consumed
    assert 4 not in consumed


def test_a_sustained_loss_spike_trips_at_its_fourth_step_with_the_onset(
    tiny_gpt: ModuleType, tmp_path: Path
) -> None:
    model = tiny_model(tiny_gpt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = token_batches()
    termination = tmp_path / "termination-log"
    env = GuardEnv(termination_path=termination, lineage_root=tmp_path / "lineage")
    quick_baseline = BaselineConfig(warmup_steps=5, min_samples=5)
    guard = Guard(
        model,
        optimizer,
        data=batches,
        directives=directives(baseline=quick_baseline),
        guard_env=env,
    )

    def train_with_tripled_loss_from_step_20() -> None:
        for step in range(1, 60):
            batch = next(batches)
            loss = model(batch[:, :-1], batch[:, 1:])
            if step >= 20:
                loss = loss * 3.0
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad()

    with pytest.raises(TrainingTripped) as tripped:
        train_with_tripled_loss_from_step_20()
    report = tripped.value.report
    assert (report.signal, report.step, report.onset_step) == (Signal.LOSS_SPIKE, 23, 20)
    assert report.last_good_step == 19
    assert report.value is not None
    assert report.threshold is not None
    assert report.value >= report.threshold
    assert parse_termination_message(termination.read_text()) == report
    lineage = json.loads((Path(report.lineage_path) / "rank-0.json").read_text())
    assert lineage["onsetStep"] == 20
    assert lineage["steps"][-1]["step"] == 23


def test_a_live_threshold_directive_changes_what_trips_from_the_next_step(
    tiny_gpt: ModuleType,
) -> None:
    model = tiny_model(tiny_gpt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = token_batches()
    strict = DetectionConfig(non_finite=NonFiniteConfig(consecutive_steps=1))
    source = DirectiveSource(0, Directives(generation=1, attempt=0, detection=strict))
    guard = Guard(model, optimizer, data=batches, directives=source, guard_env=GuardEnv())
    generations = []
    for step in range(1, 9):
        if step == 3:
            offered = source.offer(
                Directives(generation=2, attempt=0, detection=strict, trip_on=("LossSpike",))
            )
            assert offered.applied_generation == 2
            assert source.offer(Directives(generation=1, attempt=0)).applied_generation == 2
        batch = next(batches)
        loss = model(batch[:, :-1], batch[:, 1:])
        if step == 5:
            loss = loss * float("nan")
        loss.backward()
        verdict = guard.step(loss)
        optimizer.zero_grad()
        generations.append(guard.applied_generation)
        if step == 5:
            assert not verdict.trip
            assert [f.signal for f in verdict.findings] == [Signal.NON_FINITE]
    assert generations == [1, 1, 2, 2, 2, 2, 2, 2]
    assert guard.skipped_steps == 1
    assert params_finite(model)


def test_checkpoint_settings_of_adopted_directives_reach_the_manager_at_that_step(
    tiny_gpt: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """An edited spec's interval and retention arrive with newer directives: the guard hands
    them to its checkpoint manager at the step every rank adopts them (and to a manager
    attached after construction, the settings in force), and says so in the pod's log."""
    model = tiny_model(tiny_gpt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = token_batches()
    first = CheckpointSettings(interval_steps=25, keep_local=8, keep_pfs=8, spike_markers=2)
    edited = first.model_copy(update={"interval_steps": 10, "keep_pfs": 12})
    source = DirectiveSource(0, Directives(generation=1, attempt=0, checkpoints=first))
    guard = Guard(model, optimizer, data=batches, directives=source, guard_env=GuardEnv())
    manager = RecordedCheckpoints()
    guard.checkpoints = manager
    assert manager.settings == [first], "attached after construction: the settings in force"
    for step in range(1, 5):
        if step == 3:
            source.offer(Directives(generation=2, attempt=0, checkpoints=edited,
                                    trip_on=("NonFinite",)))  # fmt: skip
        batch = next(batches)
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()
        assert len(manager.settings) == (2 if step >= 3 else 1), step
    assert manager.settings[-1] == edited
    assert (
        "stabletrain: directives generation 2 of attempt 0 in force from step 4: trip on "
        "NonFinite, LR scale 1" in capsys.readouterr().out
    )


def test_a_loss_spike_while_the_baseline_seeds_trips_instead_of_being_learned(
    tiny_gpt: ModuleType, tmp_path: Path
) -> None:
    """The poisoned shard read just after the warm-up: before, its loss seeded the baseline."""
    model = tiny_model(tiny_gpt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = token_batches()
    seeding = BaselineConfig(warmup_steps=5, min_samples=20)
    guard = Guard(
        model,
        optimizer,
        data=batches,
        directives=directives(baseline=seeding),
        guard_env=GuardEnv(termination_path=tmp_path / "termination-log"),
    )

    def train_with_tripled_loss_from_step_9() -> None:
        for step in range(1, 60):
            batch = next(batches)
            loss = model(batch[:, :-1], batch[:, 1:])
            if step >= 9:
                loss = loss * 3.0
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad()

    with pytest.raises(TrainingTripped) as tripped:
        train_with_tripled_loss_from_step_9()
    report = tripped.value.report
    assert (report.signal, report.step, report.onset_step) == (Signal.LOSS_SPIKE, 12, 9)
    assert report.last_good_step == 8


def trained_guard(tiny_gpt: ModuleType, env: GuardEnv, steps: int = 5) -> Guard:
    model = tiny_model(tiny_gpt)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = token_batches()
    guard = Guard(model, optimizer, data=batches, directives=directives(), guard_env=env)
    for _ in range(steps):
        batch = next(batches)
        loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()
    return guard


def test_a_clean_close_leaves_the_final_step_and_loss(tiny_gpt: ModuleType, tmp_path: Path) -> None:
    """The operator's last scrape may be steps behind; the message it reads once the pods
    succeeded carries the last step and its loss."""
    termination = tmp_path / "termination-log"
    termination.touch()  # the kubelet mounts an empty file
    guard = trained_guard(tiny_gpt, GuardEnv(termination_path=termination))
    guard.close()
    completion = parse_completion(termination.read_text())
    assert completion is not None
    assert (completion.step, completion.attempt) == (5, 0)
    assert completion.loss == guard.monitor.snapshot().loss
    assert completion.loss is not None
    guard.close()
    assert parse_completion(termination.read_text()) == completion


def test_close_with_an_error_in_flight_or_on_another_local_rank_states_no_completion(
    tiny_gpt: ModuleType, tmp_path: Path
) -> None:
    termination = tmp_path / "termination-log"
    failing = trained_guard(tiny_gpt, GuardEnv(termination_path=termination))
    try:
        raise RuntimeError("the loop failed")
    except RuntimeError:
        failing.close()  # as from the loop's `finally` while the error propagates
    other = trained_guard(tiny_gpt, GuardEnv(local_rank=1, termination_path=termination))
    other.close()
    assert not termination.exists()


def test_a_completion_that_cannot_be_written_does_not_fail_the_finished_run(
    tiny_gpt: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unwritable = tmp_path / "no-such-directory" / "termination-log"
    trained_guard(tiny_gpt, GuardEnv(termination_path=unwritable)).close()
    assert "final step not left in" in capsys.readouterr().err


def test_a_trip_report_is_never_replaced_by_a_completion(
    tiny_gpt: ModuleType, tmp_path: Path
) -> None:
    """A script that catches the trip and closes the guard afterwards, error handled."""
    termination = tmp_path / "termination-log"
    env = GuardEnv(termination_path=termination, lineage_root=tmp_path / "lineage")
    guard, _, _ = tripped_on_inf_loss(tiny_gpt, env)
    guard.close()
    assert parse_termination_message(termination.read_text()).step == 7
