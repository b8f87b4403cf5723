"""Each preflight check on its own: a clean run has no finding, and one change at a time
produces exactly the finding it should, with its severity and a fix."""

from __future__ import annotations

from typing import Any

import pytest

from stabletrain_contract.preflight import (
    OptimizerFacts,
    Precision,
    PreflightFacts,
    TierFacts,
)
from stabletrain_operator.api.quantity import quantity_bytes
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.preflight.checklist import Severity, evaluate

GIB = 2**30
CHECKPOINT = 1 * GIB


def job_spec(**overrides: Any) -> StableTrainingJobSpec:
    data: dict[str, Any] = {
        "workers": {"template": {"spec": {"containers": [{"name": "t", "command": ["x"]}]}}},
        "checkpoints": {
            "local": {"hostPath": "/nvme", "retention": 3},
            "pfs": {"claimName": "pfs", "retention": 3},
            "intervalSteps": 200,
            "spikeMarkers": 2,
        },
    }
    data.update(overrides)
    return StableTrainingJobSpec.model_validate(data)


def clean_facts(**changes: Any) -> PreflightFacts:
    optimizer = OptimizerFacts(
        name="AdamW", adaptive=True, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1
    )
    data: dict[str, Any] = {
        "max_grad_norm": 1.0,
        "warmup_steps": 2000,
        "peak_lr": 3e-4,
        "precision": Precision.BF16,
        "optimizer": optimizer,
        "parameters": CHECKPOINT // 12,
        "checkpoint_bytes_estimate": CHECKPOINT,
        "tiers": (
            TierFacts(name="local", path="/stabletrain/local", free_bytes=100 * GIB),
            TierFacts(name="pfs", path="/stabletrain/pfs", free_bytes=1000 * GIB),
        ),
        "data_shards": 64,
        "world_size": 8,
    }
    data.update(changes)
    return PreflightFacts(**data)


def adam(**changes: Any) -> OptimizerFacts:
    return clean_facts().optimizer.model_copy(update=changes)


def only(facts: PreflightFacts, spec: StableTrainingJobSpec | None = None) -> tuple[str, str, str]:
    (finding,) = evaluate(facts, spec or job_spec())
    assert finding.fix, "every finding says what to change"
    assert "\n" not in finding.line(), "one line per finding"
    return finding.check, finding.severity.value, finding.line()


def test_a_clean_configuration_produces_no_finding() -> None:
    assert evaluate(clean_facts(), job_spec()) == ()
    budget = job_spec(preflight={"maxLostSteps": 2000}, checkpoints={
        "local": {"hostPath": "/nvme", "sizeLimit": "10Gi"}, "pfs": {"claimName": "pfs"},
    })  # fmt: skip
    assert evaluate(clean_facts(), budget) == ()
    sgd = OptimizerFacts(name="SGD", adaptive=False, weight_decay=0.0)
    assert evaluate(clean_facts(optimizer=sgd, precision=Precision.FP32), job_spec()) == ()


@pytest.mark.parametrize(
    ("changes", "check", "severity", "words"),
    [
        ({"max_grad_norm": None}, "no-clipping", "Severe", "not clipped"),
        ({"warmup_steps": 0}, "no-warmup", "Warning", "peak LR 0.0003"),
        ({"warmup_steps": None}, "no-warmup", "Warning", "no LR scheduler"),
        (
            {"warmup_steps": None, "scheduler": "ReduceLROnPlateau"},
            "no-warmup", "Warning", "ReduceLROnPlateau could not be probed",
        ),
        ({"precision": Precision.FP16}, "fp16-static-loss-scale", "Severe", "underflow"),
        (
            {"precision": Precision.FP16, "grad_scaler": True, "dynamic_loss_scale": True,
             "optimizer": adam(state_dtype="float16")},
            "fp16-adam-eps", "Severe", "eps 1e-08 rounds to 0",
        ),
        ({"optimizer": adam(beta2=0.999)}, "adam-beta2-high", "Warning", "beta2 0.999"),
        ({"data_shards": None}, "no-data-skipping", "Warning", "cannot skip the data"),
        (
            {"tiers": (TierFacts(name="local", path="/l", free_bytes=5 * GIB),)},
            "tier-too-small", "Severe", "keeping 5 checkpoints",
        ),
        (
            {"tiers": (TierFacts(name="pfs", path="/stabletrain/pfs"),)},
            "tier-missing", "Severe", "/stabletrain/pfs does not exist",
        ),
    ],
)  # fmt: skip
def test_each_finding_on_its_own(
    changes: dict[str, Any], check: str, severity: str, words: str
) -> None:
    found, level, line = only(clean_facts(**changes))
    assert (found, level) == (check, severity)
    assert words in line


def test_fp16_with_a_dynamic_scaler_and_fp32_state_is_fine() -> None:
    facts = clean_facts(precision=Precision.FP16, grad_scaler=True, dynamic_loss_scale=True)
    assert evaluate(facts, job_spec()) == ()
    big_eps = clean_facts(
        precision=Precision.FP16, dynamic_loss_scale=True, optimizer=adam(state_dtype="float16",
                                                                          eps=1e-4),
    )  # fmt: skip
    assert evaluate(big_eps, job_spec()) == ()


def test_the_tier_needs_retention_plus_markers_plus_the_save_in_flight() -> None:
    needed = (3 + 2 + 1) * CHECKPOINT
    enough = TierFacts(name="local", path="/l", free_bytes=needed)
    short = TierFacts(name="local", path="/l", free_bytes=needed - 1)
    assert evaluate(clean_facts(tiers=(enough,)), job_spec()) == ()
    _, _, line = only(clean_facts(tiers=(short,)))
    assert "needs 6.0 GiB" in line
    assert "checkpoints.local.retention" in line


def test_a_size_limit_below_two_checkpoints_is_severe() -> None:
    spec = job_spec(checkpoints={
        "local": {"hostPath": "/nvme", "sizeLimit": "1500Mi"}, "pfs": {"claimName": "pfs"},
    })  # fmt: skip
    check, severity, line = only(clean_facts(), spec)
    assert (check, severity) == ("tier-too-small", "Severe")
    assert "sizeLimit 1500Mi cannot hold 2 checkpoints" in line


def test_checkpoint_interval_against_the_lost_work_budget() -> None:
    # Default rules: a Rollback goes back at least minStepsBeforeOnset = 100 steps.
    over = job_spec(preflight={"maxLostSteps": 250})
    check, severity, line = only(clean_facts(), over)
    assert (check, severity) == ("checkpoint-interval-over-budget", "Severe")
    assert "every 200 steps plus rollback.minStepsBeforeOnset 100 can lose 300" in line
    assert "save at least every 150 steps" in line
    assert evaluate(clean_facts(), job_spec(preflight={"maxLostSteps": 300})) == ()
    declared = clean_facts(checkpoint_interval_steps=100)
    checked = [f.check for f in evaluate(declared, over)]
    assert "checkpoint-interval-over-budget" not in checked, "the script's interval wins"
    restart_only = job_spec(
        preflight={"maxLostSteps": 150},
        recovery={"rules": [{"name": "r", "onSignals": ["WorkerFailure"],
                             "action": "RestartFromLatest"}]},
    )  # fmt: skip
    _, _, line = only(clean_facts(), restart_only)
    assert "every 200 steps can lose 200" in line


def test_severe_findings_come_first() -> None:
    facts = clean_facts(optimizer=adam(beta2=0.999), max_grad_norm=None, data_shards=None)
    found = evaluate(facts, job_spec())
    assert [f.check for f in found] == ["no-clipping", "adam-beta2-high", "no-data-skipping"]
    assert [f.severity for f in found] == [Severity.SEVERE, Severity.WARNING, Severity.WARNING]


def test_quantities() -> None:
    assert quantity_bytes("1Gi") == GIB
    assert quantity_bytes("2T") == 2 * 10**12
    assert quantity_bytes("1e9") == 10**9
    assert quantity_bytes(512) == 512
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        quantity_bytes("12 GB")


def test_a_size_limit_needs_room_for_two_checkpoints_and_the_one_being_written() -> None:
    spec = job_spec(checkpoints={
        "local": {"hostPath": "/nvme", "sizeLimit": "2560Mi"}, "pfs": {"claimName": "pfs"},
    })  # fmt: skip
    check, severity, line = only(clean_facts(), spec)
    assert (check, severity) == ("tier-too-small", "Severe")
    assert "raise checkpoints.local.sizeLimit to at least 3.0 GiB" in line


def test_the_local_tier_is_judged_by_what_the_agent_keeps_under_its_size_limit() -> None:
    spec = job_spec(checkpoints={
        "local": {"hostPath": "/nvme", "retention": 3, "sizeLimit": "4Gi"},
        "pfs": {"claimName": "pfs"}, "spikeMarkers": 2,
    })  # fmt: skip
    # 4 GiB holds 3 copies next to the one being written: 4 GiB free is enough (retention 3
    # + 2 markers + 1 would need 6), and the cap itself is worth a warning.
    local = TierFacts(name="local", path="/l", free_bytes=4 * GIB)
    pfs = TierFacts(name="pfs", path="/p", free_bytes=1000 * GIB)
    check, severity, line = only(clean_facts(tiers=(local, pfs)), spec)
    assert (check, severity) == ("local-retention-capped", "Warning")
    assert "the agent keeps 3 of retention 3 + spikeMarkers 2" in line
    assert "raise checkpoints.local.sizeLimit to 6.0 GiB" in line


def with_memory_limit(
    limit: str | None,
    processes: int = 1,
    recovery: dict[str, Any] | None = None,
    **checkpoints: Any,
) -> Any:
    container: dict[str, Any] = {"name": "t", "command": ["x"]}
    if limit is not None:
        container["resources"] = {"limits": {"memory": limit}}
    return job_spec(
        workers={
            "processesPerNode": processes,
            "template": {"spec": {"containers": [container]}},
        },
        checkpoints={
            "local": {"hostPath": "/nvme"},
            "pfs": {"claimName": "pfs"},
            "intervalSteps": 200,
            **checkpoints,
        },
        **({"recovery": recovery} if recovery is not None else {}),
    )


def findings_of(check: str, facts: PreflightFacts, spec: StableTrainingJobSpec) -> list[Any]:
    return [f for f in evaluate(facts, spec) if f.check == check]


def memory_findings(facts: PreflightFacts, spec: StableTrainingJobSpec) -> list[Any]:
    return findings_of("memory-tier-too-large", facts, spec)


def test_the_memory_tier_is_judged_against_the_containers_memory_limit() -> None:
    """2 snapshots of 1 GiB plus one staging copy per rank: 4 GiB with 2 ranks per pod."""
    facts = clean_facts()
    assert memory_findings(facts, with_memory_limit("16Gi", processes=2)) == []
    (warning,) = memory_findings(facts, with_memory_limit("6Gi", processes=2))
    assert warning.severity is Severity.WARNING
    assert "4.0 GiB in all" in warning.message
    assert "of 6.0 GiB" in warning.message
    (severe,) = memory_findings(facts, with_memory_limit("4Gi", processes=2))
    assert severe.severity is Severity.SEVERE
    assert "kills the container" in severe.message
    assert "resources.limits.memory by 4.0 GiB" in severe.fix
    assert "checkpoints.memory.intervalSteps: 0" in severe.fix


def test_the_cgroup_limit_the_agent_reads_wins_over_the_template() -> None:
    """A LimitRange default is in the cgroup, not in the template."""
    cgroup = clean_facts(memory_limit_bytes=3 * GIB)
    (severe,) = memory_findings(cgroup, with_memory_limit(None))
    assert severe.severity is Severity.SEVERE
    assert memory_findings(clean_facts(memory_limit_bytes=64 * GIB), with_memory_limit("3Gi")) == []


def test_no_memory_tier_or_no_limit_means_no_memory_finding() -> None:
    facts = clean_facts()
    assert memory_findings(facts, with_memory_limit("2Gi", memory={"intervalSteps": 0})) == []
    assert memory_findings(facts, with_memory_limit(None)) == []
    assert memory_findings(facts, with_memory_limit("lots")) == []


def standby_findings(facts: PreflightFacts, spec: StableTrainingJobSpec) -> list[Any]:
    return findings_of("warm-standby-too-large", facts, spec)


def test_the_warm_standbys_are_judged_against_the_containers_memory_limit() -> None:
    """Torchrun (515 MB) and one interpreter per rank (640 MB): 1.7 GiB with 2 ranks."""
    facts = clean_facts()
    assert standby_findings(facts, with_memory_limit("4Gi", processes=2)) == []
    (warning,) = standby_findings(facts, with_memory_limit("2Gi", processes=2))
    assert warning.severity is Severity.WARNING
    assert "each of its 2 rank(s)" in warning.message
    assert "1.7 GiB in all" in warning.message
    (severe,) = standby_findings(facts, with_memory_limit("1Gi", processes=2))
    assert severe.severity is Severity.SEVERE
    assert "recovery.warmStart: false" in severe.fix
    cold = {"warmStart": False}
    assert standby_findings(facts, with_memory_limit("1Gi", processes=2, recovery=cold)) == []
    recreate = {"restart": "RecreatePods"}
    assert standby_findings(facts, with_memory_limit("1Gi", 2, recovery=recreate)) == []
    assert standby_findings(facts, with_memory_limit(None, processes=2)) == []


def test_retention_that_cannot_hold_an_escalated_rollback_warns_per_tier() -> None:
    """The issue's case: checkpoints every 25 steps, 8 kept on each tier (200 steps), the
    default rollback 100 steps before the onset doubled per recurrence up to 2: level 1
    needs 200 + 25 = 225 steps, level 2 425. Seen live: the second rollback (onset 529)
    found nothing kept between step 25 and 350 and resumed from 25, discarding 500 steps."""
    spec = job_spec(
        checkpoints={
            "local": {"hostPath": "/nvme", "retention": 8},
            "pfs": {"claimName": "pfs", "retention": 8},
            "intervalSteps": 25,
            "spikeMarkers": 2,
        }
    )
    found = {f.message.split(" tier ")[0]: f for f in evaluate(clean_facts(), spec)}
    assert set(found) == {"the local", "the pfs"}
    pfs = found["the pfs"]
    assert (pfs.check, pfs.severity) == ("retention-below-rollback-depth", Severity.WARNING)
    assert pfs.message == (
        "the pfs tier keeps 8 checkpoints 25 steps apart (200 steps), but the rollback of "
        "rules non-finite, loss-spike at escalation level 1 needs one 200 steps before the onset "
        "(minStepsBeforeOnset 100 doubled per level, up to escalation.maxRecurrences 2) plus "
        "an interval: level 1: 225, level 2: 425 steps; such a rollback falls back to the "
        "newest checkpoint before the onset, as little as one interval before it, or an older "
        "one still kept such as an earlier rollback's target (noCheckpointFarEnough: "
        "NarrowMargin)"
    )
    assert pfs.fix.startswith("keep at least 17 checkpoints on the pfs tier")
    assert "falls back to the newest checkpoint before the onset" in found["the local"].message
    # 17 kept on the PFS holds level 2 (425 steps); the local tier's 8 then fall back to it.
    deep_pfs = job_spec(
        checkpoints={
            "local": {"hostPath": "/nvme", "retention": 8},
            "pfs": {"claimName": "pfs", "retention": 17},
            "intervalSteps": 25,
        }
    )
    (local,) = evaluate(clean_facts(), deep_pfs)
    assert "the local tier keeps 8" in local.message
    assert local.message.endswith("falls back to the PFS copy of the target, which every node "
                                  "re-seeds from")  # fmt: skip
    pfs_verified = deep_pfs.model_copy(
        update={"checkpoints": deep_pfs.checkpoints.model_copy(update={"selection": "PfsVerified"})}
    )
    assert evaluate(clean_facts(), pfs_verified) == (), "PfsVerified needs no local copy"
    one_level = job_spec(
        checkpoints=spec.checkpoints.model_dump(by_alias=True),
        recovery={"escalation": {"maxRecurrences": 0},
                  "rules": [{"name": "loss-spike", "onSignals": ["LossSpike"],
                             "action": "Rollback",
                             "rollback": {"noCheckpointFarEnough": "Fail"}}]},
    )  # fmt: skip
    assert evaluate(clean_facts(), one_level) == (), "level 0 needs 125 of the 200 steps"
    deeper = job_spec(
        checkpoints=spec.checkpoints.model_dump(by_alias=True),
        recovery={"escalation": {"maxRecurrences": 1},
                  "rules": [{"name": "loss-spike", "onSignals": ["LossSpike"],
                             "action": "Rollback",
                             "rollback": {"noCheckpointFarEnough": "Fail"}}]},
    )  # fmt: skip
    assert "falls back to nothing: the job fails with NoUsableCheckpoint" in (
        evaluate(clean_facts(), deeper)[-1].message
    )
