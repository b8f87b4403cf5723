"""The checklist: the run's start-up facts against known causes of spikes and lost work.

Each check is a plain function of the agent's PreflightFacts and the job's spec that returns
at most one finding, and each keeps to what a public source justifies (docs/preflight.md
cites them). Severe findings are the ones that make a spike or a loss of work likely enough
that a job in Refuse mode should not start with them; warnings are worth changing but runs
succeed with them every day.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from stabletrain_contract.checkpoint.retention import MIN_KEEP, local_copies
from stabletrain_contract.preflight import Precision, PreflightFacts, TierFacts
from stabletrain_operator.api.quantity import quantity_bytes
from stabletrain_operator.api.spec import (
    CheckpointSelection,
    NoCheckpointDecision,
    RecoveryRule,
    RestartMode,
    StableTrainingJobSpec,
)
from stabletrain_operator.policy.action_registry import kind_of
from stabletrain_operator.policy.arithmetic import widening

FP16_SMALLEST_SUBNORMAL = 2.0**-24
"""About 5.96e-8: any smaller epsilon rounds to 0 in IEEE binary16."""
BETA2_HIGH = 0.999
"""PyTorch's default; GPT-3 and LLaMA trained with 0.95 (see docs/preflight.md)."""
KEEP_AT_LEAST = MIN_KEEP
"""The agent never keeps fewer than 2 checkpoints per tier (the rollback target survives a
new save); a tier that cannot hold 2 cannot protect anything."""
MEMORY_SNAPSHOTS_HELD = 2
"""The memory tier holds the newest complete snapshot plus the one being written."""
MEMORY_TIER_SHARE = 0.5
"""Above this share of the container's memory limit the memory tier leaves training less
than it takes itself: a warning; at the limit, a severe finding (the kernel OOM-kills the
container at the first snapshots)."""

WARM_LAUNCHER_BYTES = 515 * 10**6
"""Resident memory of the idle standby torchrun (torch imported), measured with torch
2.9.1+cu128 and no GPU (docs/operations.md, Restarts in place)."""
WARM_WORKER_BYTES = 640 * 10**6
"""Resident memory of one idle standby worker (torch, torch._dynamo and the agent imported),
measured as WARM_LAUNCHER_BYTES."""


class Severity(StrEnum):
    SEVERE = "Severe"
    """Refuse mode starts no worker pod while one stands."""
    WARNING = "Warning"


@dataclass(frozen=True)
class Finding:
    check: str
    """Stable id of the check (docs/preflight.md), e.g. no-clipping."""
    severity: Severity
    message: str
    """What is wrong, with the numbers."""
    fix: str
    """What to change."""

    def line(self) -> str:
        """One line of the Preflight condition's message."""
        return f"{self.severity}: {self.check}: {self.message}; fix: {self.fix}"


Check = Callable[[PreflightFacts, StableTrainingJobSpec], Finding | None]


def no_clipping(facts: PreflightFacts, _: StableTrainingJobSpec) -> Finding | None:
    if facts.max_grad_norm is not None:
        return None
    return Finding(
        "no-clipping",
        Severity.SEVERE,
        "gradients are not clipped, so one bad batch can move the weights arbitrarily far",
        "pass max_grad_norm=1.0 to the Guard (GPT-3, OPT, LLaMA clip the global norm at 1.0)",
    )


def no_warmup(facts: PreflightFacts, _: StableTrainingJobSpec) -> Finding | None:
    if facts.warmup_steps is None and facts.scheduler is not None:
        return Finding(
            "no-warmup",
            Severity.WARNING,
            f"the warm-up of {facts.scheduler} could not be probed (it cannot be stepped "
            "without arguments)",
            "declare warmup_steps=N to Guard.from_env, or warm up with a scheduler",
        )
    if facts.warmup_steps is None:
        return Finding(
            "no-warmup",
            Severity.WARNING,
            "no LR scheduler is attached to the Guard, so the LR is constant from step 1",
            "warm the LR up linearly (pass the scheduler to the Guard), or declare "
            "warmup_steps=N to Guard.from_env if the loop warms up by itself",
        )
    if facts.warmup_steps == 0 and (facts.peak_lr or 0.0) > 0.0:
        return Finding(
            "no-warmup",
            Severity.WARNING,
            f"the first step already runs at the peak LR {facts.peak_lr:g}",
            "ramp the LR up linearly over the first steps (commonly 0.1-1% of training)",
        )
    return None


def fp16_without_dynamic_scaling(facts: PreflightFacts, _: StableTrainingJobSpec) -> Finding | None:
    if facts.precision is not Precision.FP16 or facts.dynamic_loss_scale:
        return None
    return Finding(
        "fp16-static-loss-scale",
        Severity.SEVERE,
        "fp16 training without a dynamic loss scale: small gradients underflow to 0 and "
        "large ones overflow to inf",
        "use an enabled torch.amp.GradScaler and pass it to the Guard, or train in bf16",
    )


def fp16_adam_eps(facts: PreflightFacts, _: StableTrainingJobSpec) -> Finding | None:
    optimizer = facts.optimizer
    if not optimizer.adaptive or optimizer.eps is None or optimizer.state_dtype != "float16":
        return None
    if optimizer.eps >= FP16_SMALLEST_SUBNORMAL:
        return None
    return Finding(
        "fp16-adam-eps",
        Severity.SEVERE,
        f"{optimizer.name} eps {optimizer.eps:g} rounds to 0 in its fp16 state (smallest "
        f"fp16 value {FP16_SMALLEST_SUBNORMAL:.3g}): an update divides by sqrt(v) alone",
        "keep fp32 parameters under autocast (the optimizer state is then fp32), or raise "
        "eps to 1e-4",
    )


def adam_beta2_high(facts: PreflightFacts, _: StableTrainingJobSpec) -> Finding | None:
    optimizer = facts.optimizer
    if not optimizer.adaptive or optimizer.beta2 is None or optimizer.beta2 < BETA2_HIGH:
        return None
    return Finding(
        "adam-beta2-high",
        Severity.WARNING,
        f"{optimizer.name} beta2 {optimizer.beta2:g}: the second-moment estimate lags "
        "behind a sudden gradient change, the pattern that precedes loss spikes at large "
        "batch and LR",
        "beta2 0.95 (GPT-3, LLaMA) or 0.98",
    )


def _checkpoint_interval(facts: PreflightFacts, spec: StableTrainingJobSpec) -> int:
    """The script's declared interval when it gives one (it decides when to save)."""
    return facts.checkpoint_interval_steps or spec.checkpoints.interval_steps


def _rollback_rewind(spec: StableTrainingJobSpec) -> int:
    """Steps a rollback goes back at least, beyond the interval: the largest margin before
    the onset that any Rollback rule demands."""
    margins = [
        rule.rollback_params().min_steps_before_onset
        for rule in spec.recovery.rules
        if kind_of(rule.action).goes_before_onset
    ]
    return max(margins, default=0)


def interval_over_budget(facts: PreflightFacts, spec: StableTrainingJobSpec) -> Finding | None:
    budget = spec.preflight.max_lost_steps
    if budget is None:
        return None
    interval = _checkpoint_interval(facts, spec)
    rewind = _rollback_rewind(spec)
    worst = interval + rewind
    if worst <= budget:
        return None
    because = f" plus rollback.minStepsBeforeOnset {rewind}" if rewind else ""
    return Finding(
        "checkpoint-interval-over-budget",
        Severity.SEVERE,
        f"a checkpoint every {interval} steps{because} can lose {worst} steps, over the "
        f"budget of {budget} (preflight.maxLostSteps)",
        f"save at least every {max(budget - rewind, 1)} steps (checkpoints.intervalSteps and "
        "the script's save interval)",
    )


def _required_bytes(facts: PreflightFacts, keep: int) -> int:
    """`keep` checkpoints plus the one being written before the oldest goes."""
    return (keep + 1) * facts.checkpoint_bytes_estimate


def _tier_finding(tier: TierFacts, keep: int, facts: PreflightFacts) -> Finding | None:
    if tier.free_bytes is None:
        return Finding(
            "tier-missing",
            Severity.SEVERE,
            f"the {tier.name} checkpoint tier {tier.path} does not exist in the pod",
            f"mount the {tier.name} tier (checkpoints.{tier.name}) where the pod's env says",
        )
    needed = _required_bytes(facts, keep)
    if tier.free_bytes >= needed:
        return None
    return Finding(
        "tier-too-small",
        Severity.SEVERE,
        f"the {tier.name} tier has {_size(tier.free_bytes)} free but keeping {keep} "
        f"checkpoints of about {_size(facts.checkpoint_bytes_estimate)} (plus the one being "
        f"written) needs {_size(needed)}",
        f"give the {tier.name} tier at least {_size(needed)} or lower "
        f"checkpoints.{tier.name}.retention",
    )


def _local_size_limit_bytes(spec: StableTrainingJobSpec) -> int | None:
    limit = spec.checkpoints.local.size_limit
    return None if limit is None else quantity_bytes(limit)


def _kept_on(name: str, facts: PreflightFacts, spec: StableTrainingJobSpec) -> int:
    """The copies the agent keeps on a tier between saves, as its retention counts them."""
    checkpoints = spec.checkpoints
    if name == "pfs":
        return checkpoints.pfs.retention + checkpoints.spike_markers
    return local_copies(
        checkpoints.local.retention,
        checkpoints.spike_markers,
        _local_size_limit_bytes(spec),
        facts.checkpoint_bytes_estimate,
    )


def _tier_space(name: str) -> Check:
    def check(facts: PreflightFacts, spec: StableTrainingJobSpec) -> Finding | None:
        tier = next((t for t in facts.tiers if t.name == name), None)
        if tier is None:
            return None
        return _tier_finding(tier, _kept_on(name, facts, spec), facts)

    check.__name__ = f"{name}_tier_space"
    return check


def local_size_limit(facts: PreflightFacts, spec: StableTrainingJobSpec) -> Finding | None:
    limit = spec.checkpoints.local.size_limit
    if limit is None or facts.checkpoint_bytes_estimate == 0:
        return None
    needed = _required_bytes(facts, KEEP_AT_LEAST)
    if quantity_bytes(limit) >= needed:
        return None
    return Finding(
        "tier-too-small",
        Severity.SEVERE,
        f"checkpoints.local.sizeLimit {limit} cannot hold {KEEP_AT_LEAST} checkpoints of about "
        f"{_size(facts.checkpoint_bytes_estimate)} plus the one being written",
        f"raise checkpoints.local.sizeLimit to at least {_size(needed)}",
    )


def local_retention_capped(facts: PreflightFacts, spec: StableTrainingJobSpec) -> Finding | None:
    limit = _local_size_limit_bytes(spec)
    checkpoints = spec.checkpoints
    wanted = checkpoints.local.retention + checkpoints.spike_markers
    kept = _kept_on("local", facts, spec)
    if limit is None or kept >= wanted or limit < _required_bytes(facts, KEEP_AT_LEAST):
        return None  # below 2 + 1 copies local_size_limit says so, as a severe finding
    return Finding(
        "local-retention-capped",
        Severity.WARNING,
        f"checkpoints.local.sizeLimit {checkpoints.local.size_limit} holds {kept} checkpoints "
        f"of about {_size(facts.checkpoint_bytes_estimate)} next to the one being written, so "
        f"the agent keeps {kept} of retention {checkpoints.local.retention} + spikeMarkers "
        f"{checkpoints.spike_markers} on each node (spike markers and the oldest go first)",
        f"raise checkpoints.local.sizeLimit to {_size(_required_bytes(facts, wanted))} or "
        "lower checkpoints.local.retention to "
        f"{max(KEEP_AT_LEAST, kept - checkpoints.spike_markers)}",
    )


def memory_tier_bytes(facts: PreflightFacts, spec: StableTrainingJobSpec) -> int:
    """What the memory tier adds to the pod's memory: the snapshots it holds, plus each
    rank's staging copy of its state (the snapshot is written from it in the background).
    An upper bound: with sharded state a pod's snapshot and each rank's copy are smaller."""
    copies = MEMORY_SNAPSHOTS_HELD + spec.workers.processes_per_node
    return copies * facts.checkpoint_bytes_estimate


def container_memory_limit(facts: PreflightFacts, spec: StableTrainingJobSpec) -> int | None:
    """The training container's memory limit: as its cgroup enforces it (the agent reads
    it), else as the template states it (resources.limits.memory)."""
    if facts.memory_limit_bytes is not None:
        return facts.memory_limit_bytes
    name = spec.workers.container_name
    containers = spec.workers.template["spec"]["containers"]
    container: dict[str, Any] = next(
        (c for c in containers if name is None or c.get("name") == name), {}
    )
    limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    try:
        return None if limit is None else quantity_bytes(limit)
    except ValueError:
        return None  # the API server validates pod quantities; not this check's business


def _share_of_memory_limit(needed: int, limit: int | None) -> Severity | None:
    """What `needed` bytes held in the training container mean against its memory limit:
    nothing below MEMORY_TIER_SHARE of it (or without a limit), a warning above, severe at
    the limit itself (the kernel OOM-kills the container)."""
    if limit is None or needed < limit * MEMORY_TIER_SHARE:
        return None
    return Severity.SEVERE if needed >= limit else Severity.WARNING


def memory_tier_size(facts: PreflightFacts, spec: StableTrainingJobSpec) -> Finding | None:
    if not spec.checkpoints.memory.interval_steps or facts.checkpoint_bytes_estimate == 0:
        return None
    limit = container_memory_limit(facts, spec)
    needed = memory_tier_bytes(facts, spec)
    severity = _share_of_memory_limit(needed, limit)
    if severity is None or limit is None:
        return None
    ranks = spec.workers.processes_per_node
    outcome = (
        "the kernel kills the container at the first snapshots"
        if severity is Severity.SEVERE
        else f"more than {MEMORY_TIER_SHARE:.0%} of it, leaving training the rest"
    )
    return Finding(
        "memory-tier-too-large",
        severity,
        f"the memory tier holds {MEMORY_SNAPSHOTS_HELD} snapshots of about "
        f"{_size(facts.checkpoint_bytes_estimate)} in the pod's memory plus a staging copy "
        f"for each of its {ranks} rank(s), {_size(needed)} in all, against the training "
        f"container's memory limit of {_size(limit)}: {outcome}",
        f"raise the training container's resources.limits.memory by {_size(needed)} over "
        f"what training needs without the tier (this check wants more than "
        f"{_size(round(needed / MEMORY_TIER_SHARE))}), or turn the memory tier off "
        "(checkpoints.memory.intervalSteps: 0)",
    )


def warm_standby_size(facts: PreflightFacts, spec: StableTrainingJobSpec) -> Finding | None:
    """The warm start's standbys (torchrun and one interpreter per process, imports done)
    idle beside the running attempt for the whole run, in the same memory limit."""
    if spec.recovery.restart is not RestartMode.IN_PLACE or not spec.recovery.warm_start:
        return None
    limit = container_memory_limit(facts, spec)
    ranks = spec.workers.processes_per_node
    needed = WARM_LAUNCHER_BYTES + ranks * WARM_WORKER_BYTES
    severity = _share_of_memory_limit(needed, limit)
    if severity is None or limit is None:
        return None
    outcome = (
        "the kernel kills the container before training has any memory"
        if severity is Severity.SEVERE
        else f"more than {MEMORY_TIER_SHARE:.0%} of it, leaving training the rest"
    )
    return Finding(
        "warm-standby-too-large",
        severity,
        f"the warm start keeps a standby torchrun (about {_size(WARM_LAUNCHER_BYTES)}) and "
        f"one standby interpreter for each of its {ranks} rank(s) (about "
        f"{_size(WARM_WORKER_BYTES)} each, torch imported) in the pod, {_size(needed)} in "
        f"all, against the training container's memory limit of {_size(limit)}: {outcome}",
        f"raise the training container's resources.limits.memory by {_size(needed)}, or "
        "start restarts cold (recovery.warmStart: false)",
    )


@dataclass(frozen=True)
class _Depth:
    """How far back a Rollback rule may need a checkpoint, at its deepest escalation."""

    rule: RecoveryRule
    """The first of the Rollback rules that go back furthest (its noCheckpointFarEnough
    says what a rollback falls back to)."""
    names: tuple[str, ...]
    """Every Rollback rule that goes back that far."""
    interval: int

    def steps(self, level: int) -> int:
        """Steps of history a rollback at escalation `level` needs on a tier: the target at
        least minStepsBeforeOnset x 2^level before the onset, and the newest checkpoint at
        or before that bound up to one interval older."""
        return self.distance(level) + self.interval

    def distance(self, level: int) -> int:
        """minStepsBeforeOnset x 2^level: where the target bound lies before the onset."""
        return self.rule.rollback_params().min_steps_before_onset * widening(level)


def _deepest_rollback(spec: StableTrainingJobSpec, interval: int) -> _Depth | None:
    """The Rollback rule that may reach furthest back (at escalation.maxRecurrences)."""
    rules = [r for r in spec.recovery.rules if kind_of(r.action).goes_before_onset]
    if not rules:
        return None
    deepest = max(r.rollback_params().min_steps_before_onset for r in rules)
    named = [r for r in rules if r.rollback_params().min_steps_before_onset == deepest]
    return _Depth(named[0], tuple(r.name for r in named), interval)


def _regular_kept(name: str, facts: PreflightFacts, spec: StableTrainingJobSpec) -> int:
    """Regular (resumable) checkpoints the agent keeps on a tier: its retention, fewer on the
    local tier when its size limit drops copies (markers go first, then the oldest)."""
    checkpoints = spec.checkpoints
    if name == "pfs":
        return checkpoints.pfs.retention
    return min(checkpoints.local.retention, _kept_on("local", facts, spec))


def _fallback(rule: RecoveryRule) -> str:
    """What a rollback that finds nothing far enough back resumes from (its rule's
    noCheckpointFarEnough), for the finding's message."""
    when_none = rule.rollback_params().no_checkpoint_far_enough
    if when_none is NoCheckpointDecision.FROM_SCRATCH:
        return "step 0 with nothing restored (noCheckpointFarEnough: FromScratch)"
    if when_none is NoCheckpointDecision.FAIL:
        return "nothing: the job fails with NoUsableCheckpoint (noCheckpointFarEnough: Fail)"
    return (
        "the newest checkpoint before the onset, as little as one interval before it, or "
        "an older one still kept such as an earlier rollback's target "
        "(noCheckpointFarEnough: NarrowMargin)"
    )


def _retention_depth(name: str) -> Check:
    def check(facts: PreflightFacts, spec: StableTrainingJobSpec) -> Finding | None:
        interval = _checkpoint_interval(facts, spec)
        depth = _deepest_rollback(spec, interval)
        if depth is None:
            return None
        kept = _regular_kept(name, facts, spec)
        span = kept * interval
        top = spec.recovery.escalation.max_recurrences
        short = [level for level in range(top + 1) if depth.steps(level) > span]
        if not short:
            return None
        first = short[0]
        needs = ", ".join(f"level {level}: {depth.steps(level)}" for level in short)
        pfs_holds = _regular_kept("pfs", facts, spec) * interval >= depth.steps(first)
        if name == "local" and spec.checkpoints.selection is CheckpointSelection.BOTH_TIERS:
            fallback = (
                "the PFS copy of the target, which every node re-seeds from"
                if pfs_holds
                else _fallback(depth.rule)
            )
        elif name == "local":
            return None  # PfsVerified: a PFS copy is a target as it is
        else:
            fallback = _fallback(depth.rule)
        return Finding(
            "retention-below-rollback-depth",
            Severity.WARNING,
            f"the {name} tier keeps {kept} checkpoints {interval} steps apart ({span} steps), "
            f"but the rollback of {'rules' if len(depth.names) > 1 else 'rule'} "
            f"{', '.join(depth.names)} at escalation level {first} needs one "
            f"{depth.distance(first)} steps before the onset (minStepsBeforeOnset "
            f"{depth.distance(0)} doubled per level, up to "
            f"escalation.maxRecurrences {top}) plus an interval: {needs} steps; such a "
            f"rollback falls back to {fallback}",
            f"keep at least {_ceil_div(depth.steps(top), interval)} checkpoints on the {name} "
            f"tier (checkpoints.{name}.retention), or lower escalation.maxRecurrences or "
            "rollback.minStepsBeforeOnset",
        )

    check.__name__ = f"{name}_retention_depth"
    return check


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def no_data_skipping(facts: PreflightFacts, _: StableTrainingJobSpec) -> Finding | None:
    if facts.data_shards is not None:
        return None
    return Finding(
        "no-data-skipping",
        Severity.WARNING,
        "the Guard has no ShardedBatches data helper, so a rollback can rewind and lower the "
        "LR but cannot skip the data around the onset",
        "feed batches through stabletrain_agent.data.ShardedBatches and pass it as data=",
    )


CHECKS: tuple[Check, ...] = (
    no_clipping,
    no_warmup,
    fp16_without_dynamic_scaling,
    fp16_adam_eps,
    adam_beta2_high,
    interval_over_budget,
    _tier_space("local"),
    _tier_space("pfs"),
    local_size_limit,
    local_retention_capped,
    memory_tier_size,
    warm_standby_size,
    _retention_depth("local"),
    _retention_depth("pfs"),
    no_data_skipping,
)


def evaluate(facts: PreflightFacts, spec: StableTrainingJobSpec) -> tuple[Finding, ...]:
    """Every finding, severe ones first, in checklist order within a severity."""
    found = [finding for check in CHECKS if (finding := check(facts, spec)) is not None]
    return tuple(sorted(found, key=lambda f: f.severity is not Severity.SEVERE))


def _size(size: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} B"
