"""The agent's preflight facts, read off real torch objects without disturbing them, and
the two ways they leave the pod: the status endpoint and the preflight termination message."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.amp.grad_scaler import GradScaler

from stabletrain_agent.data import Shard, ShardedBatches
from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.gather_preflight import container_memory_limit, gather_facts, probe_schedule
from stabletrain_agent.guard import Guard, GuardEnv
from stabletrain_contract import env
from stabletrain_contract.env import PREFLIGHT_ENV
from stabletrain_contract.preflight import Precision, parse_preflight_facts
from support.agent_client import fetch_status


def model(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(dtype)


def warmup_cosine(
    optimizer: torch.optim.Optimizer, warmup: int, total: int
) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def test_warmup_and_peak_are_probed_on_a_copy_that_leaves_the_schedule_alone() -> None:
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    scheduler = warmup_cosine(optimizer, warmup=10, total=1000)
    reference = warmup_cosine(
        torch.optim.AdamW(model().parameters(), lr=3e-4, betas=(0.9, 0.95)), 10, 1000
    )
    before = (scheduler.last_epoch, optimizer.param_groups[0]["lr"])

    warmup, peak = probe_schedule(optimizer, scheduler)

    assert warmup == 9, "factor(9) = 10/10 is the first step at the peak"
    assert peak == pytest.approx(3e-4)
    assert (scheduler.last_epoch, optimizer.param_groups[0]["lr"]) == before
    for _ in range(20):
        optimizer.step()
        scheduler.step()
        reference.optimizer.step()
        reference.step()
        assert optimizer.param_groups[0]["lr"] == reference.optimizer.param_groups[0]["lr"]
    assert net[0].weight.data_ptr() == next(iter(optimizer.param_groups[0]["params"])).data_ptr()


def test_no_scheduler_means_unknown_warmup_and_constant_peak() -> None:
    optimizer = torch.optim.SGD(model().parameters(), lr=0.1)
    assert probe_schedule(optimizer, None) == (None, 0.1)


def test_a_scheduler_that_cannot_step_alone_is_unknown_and_never_fails_the_run() -> None:
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    facts = gather_facts(
        net, optimizer, scheduler=plateau, scaler=None, max_grad_norm=1.0, data=None
    )
    assert (facts.warmup_steps, facts.peak_lr) == (None, 0.1)
    assert facts.scheduler == "ReduceLROnPlateau"


def test_constant_schedule_reports_no_warmup() -> None:
    optimizer = torch.optim.SGD(model().parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    assert probe_schedule(optimizer, scheduler) == (0, pytest.approx(0.1))


def test_facts_of_an_adamw_run_with_clipping_tiers_and_shards(tmp_path: Path) -> None:
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    data = ShardedBatches(
        [Shard(f"s{i}", 4) for i in range(6)], lambda s, a, b: b - a, sum, batch_size=2
    )
    (tmp_path / "local").mkdir()
    environ = {
        env.LOCAL_CHECKPOINT_DIR: str(tmp_path / "local"),
        env.PFS_CHECKPOINT_DIR: str(tmp_path / "missing"),
    }
    facts = gather_facts(
        net, optimizer, scheduler=warmup_cosine(optimizer, 50, 500), scaler=None,
        max_grad_norm=1.0, data=data, checkpoint_interval_steps=200, environ=environ,
    )  # fmt: skip
    params = sum(p.numel() for p in net.parameters())
    assert facts.max_grad_norm == 1.0
    assert facts.warmup_steps == 49
    assert facts.precision is Precision.FP32
    assert facts.optimizer.name == "AdamW"
    assert facts.optimizer.adaptive
    assert (facts.optimizer.beta1, facts.optimizer.beta2) == (0.9, 0.95)
    assert facts.optimizer.eps == 1e-8
    assert facts.optimizer.weight_decay == 0.1
    assert facts.parameters == params
    assert facts.checkpoint_bytes_estimate == params * 4 * 3, "weights + two Adam moments"
    assert facts.data_shards == 6
    local, pfs = facts.tiers
    assert local.free_bytes is not None
    assert local.free_bytes > 0
    assert pfs.free_bytes is None, "a tier directory that is missing has no free space"
    assert parse_preflight_facts(facts.to_json()) == facts


def test_half_precision_and_the_loss_scaler() -> None:
    half = model(torch.float16)
    optimizer = torch.optim.Adam(half.parameters(), lr=1e-3)
    facts = gather_facts(
        half, optimizer, scheduler=None, scaler=None, max_grad_norm=None, data=None
    )
    assert facts.precision is Precision.FP16
    assert facts.optimizer.state_dtype == "float16"
    assert not facts.grad_scaler
    assert facts.checkpoint_bytes_estimate == facts.parameters * 2 * 3

    amp = model()
    sgd = torch.optim.SGD(amp.parameters(), lr=0.1, momentum=0.9)
    facts = gather_facts(
        amp, sgd, scheduler=None, scaler=GradScaler("cpu"), max_grad_norm=1.0, data=None
    )
    assert facts.precision is Precision.FP16, "a GradScaler is there for fp16 autocast"
    assert facts.grad_scaler
    assert facts.dynamic_loss_scale
    assert facts.checkpoint_bytes_estimate == facts.parameters * 4 * 2, "momentum buffer"
    disabled = GradScaler("cpu", enabled=False)
    facts = gather_facts(amp, sgd, scheduler=None, scaler=disabled, max_grad_norm=1.0, data=None)
    assert facts.precision is Precision.FP32
    assert not facts.grad_scaler
    assert not facts.dynamic_loss_scale
    bf16 = model(torch.bfloat16)
    facts = gather_facts(
        bf16, torch.optim.SGD(bf16.parameters(), lr=0.1), scheduler=None, scaler=None,
        max_grad_norm=1.0, data=None,
    )  # fmt: skip
    assert facts.precision is Precision.BF16


def test_preflight_pod_writes_the_facts_and_exits_zero_before_any_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = tmp_path / "termination-log"
    monkeypatch.setenv(PREFLIGHT_ENV, "1")
    monkeypatch.setenv(env.TERMINATION_MESSAGE_PATH, str(message))
    monkeypatch.delenv(env.DIRECTIVES_PATH, raising=False)
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    weights = [p.detach().clone() for p in net.parameters()]

    with pytest.raises(SystemExit) as exited:
        Guard.from_env(net, optimizer, max_grad_norm=None, warmup_steps=0)

    assert exited.value.code == 0
    facts = parse_preflight_facts(message.read_bytes())
    assert facts.max_grad_norm is None
    assert facts.warmup_steps == 0
    assert facts.optimizer.name == "AdamW"
    assert all(torch.equal(a, b) for a, b in zip(weights, net.parameters(), strict=True))


def test_running_pods_show_their_facts_in_the_status_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PREFLIGHT_ENV, raising=False)
    monkeypatch.delenv(env.DIRECTIVES_PATH, raising=False)
    monkeypatch.setenv(env.AGENT_PORT, "0")
    monkeypatch.setenv(env.AGENT_BIND_ADDRESS, "127.0.0.1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.999))
    guard = Guard.from_env(net, optimizer, max_grad_norm=0.5, checkpoint_interval_steps=100)
    try:
        assert guard.exporter is not None
        facts = fetch_status(guard.exporter.url).preflight
    finally:
        guard.close()
    assert facts is not None
    assert facts.max_grad_norm == 0.5
    assert facts.optimizer.beta2 == 0.999
    assert facts.checkpoint_interval_steps == 100


def test_observe_reports_a_custom_scalar_with_the_next_step_only() -> None:
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    guard = Guard(net, optimizer, directives=DirectiveSource(0), guard_env=GuardEnv())
    x = torch.randn(4, 8)

    def step() -> None:
        loss = net(x).pow(2).mean()
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()

    guard.observe("val_loss", torch.tensor(2.5))
    guard.observe("moe_aux", 0.02)
    step()
    assert guard.monitor.snapshot().custom == {"val_loss": 2.5, "moe_aux": pytest.approx(0.02)}
    guard.observe("val_loss", 3.0)
    step()
    assert guard.monitor.snapshot().custom["val_loss"] == 3.0
    with pytest.raises(ValueError, match="lower snake_case"):
        guard.observe("Val-Loss", 1.0)


def test_the_memory_limit_is_read_from_the_containers_cgroup(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("8589934592\n")
    assert container_memory_limit(v2) == 8 * 2**30
    (v2 / "memory.max").write_text("max\n")
    assert container_memory_limit(v2) is None
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("4294967296\n")
    assert container_memory_limit(v1) == 4 * 2**30
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert container_memory_limit(v1) is None, "cgroup v1's way of saying no limit"
    assert container_memory_limit(tmp_path / "none") is None
