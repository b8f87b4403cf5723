"""spec of a StableTrainingJob: the torchrun workers, the checkpoint tiers, the policy.

Rules that span fields are CEL rules with a fieldPath, so the API server's error names the
field a person has to fix; the same rules are enforced by pydantic validators for objects
the operator builds itself.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)

from stabletrain_contract.base import as_written, kubernetes_rules
from stabletrain_contract.checkpoint.retention import MAX_SPIKE_MARKERS, MIN_KEEP
from stabletrain_contract.detection import DetectionConfig
from stabletrain_contract.directives import SkipRange
from stabletrain_contract.env import (
    DEFAULT_CHECKPOINT_INTERVAL_STEPS,
    DEFAULT_MEMORY_INTERVAL_STEPS,
    DEFAULT_RETENTION,
    DEFAULT_SPIKE_MARKERS,
)
from stabletrain_contract.names import (
    CUSTOM_SIGNAL_PREFIX,
    SIGNAL_PATTERN,
    Action,
    AnomalyClass,
    Signal,
)
from stabletrain_operator.api.base import PRESERVE_UNKNOWN, ApiModel
from stabletrain_operator.api.constants import SKIPS_PER_ACTION
from stabletrain_operator.api.shared import Shared

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""Kubernetes resource.Quantity syntax (e.g. 500Gi, 2T, 1e12)."""
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
"""DNS-1123 label: rule names show up in Events, metrics labels and condition messages."""
NODE_DIRECTORY_MESSAGE = (
    "hostPath must be a directory below / without empty, . or .. segments "
    "(the node's root directory is never mounted)"
)


def bad_directory(path: str) -> str | None:
    """Why `path` cannot be a node directory (None: it can): it must be absolute, below `/`,
    and free of empty, `.` and `..` segments. The CEL rule on LocalTierSpec says the same to
    the API server; which directories a job may use is the cluster's setting."""
    if not path.startswith("/"):
        return "it is not an absolute path"
    segments = path.rstrip("/").split("/")[1:]
    if not segments:
        return "it is the node's root directory"
    if any(segment in ("", ".", "..") for segment in segments):
        return "it has an empty, . or .. segment"
    return None


def _quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as 500Gi")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"a size cannot be negative, got {value}")
    return value


Quantity = Annotated[
    int | str,
    AfterValidator(_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
            "minimum": 0,
        }
    ),
]
SignalName = Annotated[str, Field(pattern=SIGNAL_PATTERN, max_length=70)]
Ratio = Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)]
"""A factor that must shrink the LR: 0 < x < 1."""
Floor = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]


POD_TEMPLATE: dict[str, Any] = {
    **PRESERVE_UNKNOWN,
    "required": ["spec"],
    "properties": {
        "metadata": {**PRESERVE_UNKNOWN, "description": "Labels and annotations for the pods."},
        "spec": {
            **PRESERVE_UNKNOWN,
            "description": "A core/v1 PodSpec.",
            "required": ["containers"],
            "properties": {
                "containers": {
                    "type": "array",
                    "description": "core/v1 Containers; one of them runs torchrun.",
                    "minItems": 1,
                    "items": PRESERVE_UNKNOWN,
                }
            },
        },
    },
}
"""A pod template kept open (unknown fields preserved) except for what torchrun needs: a
spec with at least one container, so a template without one is refused at apply time."""


class RendezvousSpec(ApiModel):
    """torchrun's rendezvous: how the pods of one attempt find each other."""

    backend: str = Field(default="c10d", pattern="^(c10d|static)$")
    """c10d (torchrun's default, the master is node rank 0's pod) or static."""
    port: int = Field(default=29400, ge=1024, le=65535)
    """Port of the rendezvous store on node rank 0's pod."""
    timeout_seconds: int = Field(default=900, ge=10, le=86_400)
    """How long the pods of an attempt may take to join before the attempt fails."""


FIXED_WORLD_SIZE = (
    "self == oldSelf",
    "cannot change while the job exists: every checkpoint holds one part per node and per "
    "rank, and the data order is split by rank, so no relaunch could restore them at another "
    "size; create a new job (with new checkpoint directories) instead",
    "",
)
"""CEL transition rule of the world size (workers.nodes, workers.processesPerNode)."""
FIXED_TIER = (
    "cannot change while the job exists: its checkpoints, the only rollback targets, are "
    "there; create a new job to use another place"
)
"""Message of the transition rules of the checkpoint tiers' places."""


class WorkersSpec(ApiModel):
    """The torchrun pods: one pod per node, `processesPerNode` ranks in each."""

    nodes: int = Field(
        default=1, ge=1, le=10_000, json_schema_extra=kubernetes_rules(FIXED_WORLD_SIZE)
    )
    """Pods of the torchrun job, one per node (torchrun --nnodes). Fixed once the job
    exists."""
    processes_per_node: int = Field(
        default=1, ge=1, le=1024, json_schema_extra=kubernetes_rules(FIXED_WORLD_SIZE)
    )
    """Ranks in each pod (torchrun --nproc-per-node), typically one per GPU. Fixed once the
    job exists."""
    template: dict[str, Any] = Field(json_schema_extra=POD_TEMPLATE)
    """A core/v1 PodTemplateSpec, passed through unchanged (unknown fields kept). The
    operator adds the torchrun command's environment, the tier volumes and the agent's env,
    and `automountServiceAccountToken: false` unless the template sets it. It must meet the
    cluster's Pod Security level (the operator's --pod-security, by default baseline), or the
    job is held with InvalidSpec before any pod exists."""
    container_name: str | None = Field(default=None, max_length=63)
    """Container that runs torchrun; null means the first container."""
    rendezvous: RendezvousSpec = Field(default_factory=RendezvousSpec)

    @model_validator(mode="after")
    def _template_has_containers(self) -> Self:
        spec = self.template.get("spec")
        containers = spec.get("containers") if isinstance(spec, dict) else None
        if not isinstance(containers, list) or not containers:
            raise ValueError(
                "template must be a pod template with at least one container in spec.containers"
            )
        return self


class LocalTierSpec(ApiModel):
    """Node-local tier (NVMe): fast saves and loads, lost with the node."""

    model_config = ConfigDict(
        json_schema_extra=kubernetes_rules(
            (
                "has(self.hostPath) != has(self.volume)",
                "set exactly one of hostPath or volume",
                "",
            ),
            (
                "!has(self.hostPath) || (self.hostPath.matches('^(/[^/]+)+/?$')"
                " && !self.hostPath.matches('(^|/)[.][.]?(/|$)'))",
                NODE_DIRECTORY_MESSAGE,
                ".hostPath",
            ),
            (
                "has(self.hostPath) == has(oldSelf.hostPath)"
                " && (!has(self.hostPath) || self.hostPath == oldSelf.hostPath)",
                f"hostPath {FIXED_TIER}",
                ".hostPath",
            ),
            (
                "has(self.volume) == has(oldSelf.volume)"
                " && (!has(self.volume) || self.volume == oldSelf.volume)",
                f"volume {FIXED_TIER}",
                ".volume",
            ),
        )
    )

    host_path: str | None = Field(default=None, pattern="^/.*", max_length=4096)
    """A node directory the cluster allows (the operator's --host-path-prefixes, by default
    /var/lib/stabletrain). The pods mount `<hostPath>/<namespace>/<job>` (a hostPath volume
    of type DirectoryOrCreate), so every job has a directory of its own; each pod keeps its
    copies under `node-<node rank>/` in it, so two pods of the job on one node never touch
    each other's. Any other directory holds the job with InvalidSpec. Fixed once the job
    exists."""
    volume: dict[str, Any] | None = Field(default=None, json_schema_extra=PRESERVE_UNKNOWN)
    """A core/v1 volume source instead, of a type the cluster allows (the operator's
    --local-volume-types, by default emptyDir, ephemeral and persistentVolumeClaim; never
    hostPath). Fixed once the job exists."""
    retention: int = Field(default=DEFAULT_RETENTION, ge=MIN_KEEP, le=1000)
    """Regular checkpoints each pod keeps on its node (spike markers, the rollback target
    and the one copy being written to the PFS come on top); at least 2 so the rollback
    target survives a new save. While the newest wait for the PFS, the oldest kept is the
    newest already on it (above 2)."""
    size_limit: Quantity | None = None
    """Budget of each pod's part of the tier: the agent keeps fewer checkpoints (never below
    2) so that the kept ones plus the one being written fit, dropping spike markers and the
    oldest first."""

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.host_path is None) == (self.volume is None):
            raise ValueError("set exactly one of hostPath or volume")
        return self

    @model_validator(mode="after")
    def _node_directory(self) -> Self:
        if self.host_path is not None and bad_directory(self.host_path) is not None:
            raise ValueError(NODE_DIRECTORY_MESSAGE)
        return self


class PfsTierSpec(ApiModel):
    """Shared tier: a ReadWriteMany claim every pod mounts; survives nodes, slower."""

    claim_name: str = Field(
        pattern=NAME_PATTERN.replace("{0,61}", "{0,251}"),
        max_length=253,
        json_schema_extra=kubernetes_rules(("self == oldSelf", f"claimName {FIXED_TIER}", "")),
    )
    """PersistentVolumeClaim (ReadWriteMany) in the job's namespace holding the PFS tier.
    Fixed once the job exists."""
    sub_path: str = Field(
        default="",
        max_length=4096,
        pattern=r"^([^/].*)?$",
        json_schema_extra=kubernetes_rules(("self == oldSelf", f"subPath {FIXED_TIER}", "")),
    )
    """Directory inside the claim for this job (relative); empty means the claim's root.
    Jobs sharing a claim need different directories: in one, their checkpoints collide.
    Fixed once the job exists."""
    retention: int = Field(default=DEFAULT_RETENTION, ge=MIN_KEEP, le=1000)
    """Regular checkpoints kept on the PFS (spike markers come on top); at least 2 so the
    rollback target survives a new save."""


class MemoryTierSpec(ApiModel):
    """Pod memory tier: the newest state between two saves, kept across a restart of the
    training processes inside the pod, lost with the pod."""

    interval_steps: int = Field(default=DEFAULT_MEMORY_INTERVAL_STEPS, ge=0, le=10_000_000)
    """Snapshot the state into the pod's memory (an emptyDir of medium Memory) every N
    optimizer steps, in the background, except at the steps `intervalSteps` saves; 0 turns
    the tier off. Only the newest snapshot is kept (plus the one being written), and a
    RestartFromLatest whose pods all stay in place resumes from it. It counts against the
    training container's memory limit: the preflight checks the size (docs/operations.md)."""


class CheckpointSelection(StrEnum):
    """Which copies a checkpoint needs to be a resume target."""

    BOTH_TIERS = "BothTiers"
    """Complete and verified on the PFS and on the local tier of every node the relaunch
    prefers (the last attempt's nodes, less suspects it avoids): the nearest such one wins even
    when a newer one is on the PFS only, and the Planned Event says how many steps that
    costs. A node that holds no copy of the attempt that wrote a checkpoint (new to the job,
    or back from an earlier attempt) reads that one from the PFS instead of holding it back.
    Only when none is on both tiers is a PFS-only one taken."""
    PFS_VERIFIED = "PfsVerified"
    """Complete and verified on the PFS; nodes without a local copy re-seed it from the PFS
    at start. For clusters where nodes are often replaced."""


class CheckpointsSpec(ApiModel):
    """Where and how often to save; what is kept."""

    local: LocalTierSpec
    pfs: PfsTierSpec
    memory: MemoryTierSpec = Field(default_factory=MemoryTierSpec)
    selection: CheckpointSelection = CheckpointSelection.BOTH_TIERS
    """Which copies a resume target needs: BothTiers (default) or PfsVerified."""
    interval_steps: int = Field(default=DEFAULT_CHECKPOINT_INTERVAL_STEPS, ge=1, le=10_000_000)
    """Save every N optimizer steps to the local tier (the training loop asks
    `guard.is_save_step()`); the copy to the PFS is asynchronous."""
    spike_markers: int = Field(default=DEFAULT_SPIKE_MARKERS, ge=0, le=MAX_SPIKE_MARKERS)
    """Checkpoints from inside a spike kept as evidence (never resumed from), per tier: the
    earliest of the newest anomaly, where the spike began; the agent does not write more.
    At most 3 because each costs as much storage as a real checkpoint."""


class NoCheckpointDecision(StrEnum):
    """What a Rollback does when no checkpoint lies `minStepsBeforeOnset` before the onset."""

    NARROW_MARGIN = "NarrowMargin"
    """Resume from the newest stable checkpoint before the onset, with a narrower margin
    (the margin used is recorded); from step 0 when there is none."""
    FROM_SCRATCH = "FromScratch"
    """Restart from step 0 with nothing restored; skip list, LR scale and re-warm-up apply."""
    FAIL = "Fail"
    """Fail the job with NoUsableCheckpoint."""


class SkipData(StrEnum):
    """What data a Rollback puts on the skip list."""

    SUSPECT_SHARDS = "SuspectShards"
    """The shards the trip report's lineage names (read from shortly before the onset to
    the trip), passed over for the data of the skip window, and what was passed over of
    them stays skipped in every later pass over the data (the same samples come back each
    epoch); the whole step window only when the lineage is missing or was cut, and on
    escalation."""
    STEP_RANGE = "StepRange"
    """Every batch of the skip window, whatever shard it came from (PaLM's "skip 200-500
    batches"): for loops without lineage, or data whose shards mix sources."""


class RollbackParams(ApiModel):
    """How a Rollback rewinds the run."""

    lr_factor: Ratio = 0.5
    """The LR scale is multiplied by this on each rollback (OPT-175B and BLOOM cut the LR)."""
    lr_floor: Floor = 0.05
    """The LR scale never drops below this; further rollbacks keep the floor."""
    min_steps_before_onset: int = Field(default=100, ge=0, le=1_000_000)
    """The target checkpoint must be at least this many steps before the onset (PaLM
    restarted about 100 steps before a spike: instability starts before it shows)."""
    skip_steps_before_onset: int = Field(default=50, ge=0, le=1_000_000)
    """Start of the skipped data, in steps before the onset (instability starts earlier)."""
    skip_steps_after_onset: int = Field(default=250, ge=0, le=1_000_000)
    """The skip window is [onset - before, onset + after] in steps: 300 by default, inside
    the 200-500 batches PaLM skipped."""
    skip_data: SkipData = SkipData.SUSPECT_SHARDS
    """SuspectShards (default) skips only the suspect shards' data inside the skip window,
    so clean data read next to them is kept, and keeps what it passed over of them out of
    every later pass over the data; StepRange skips the whole window. Each
    escalation level skips the whole window, twice as wide per level."""
    rewarmup_steps: int = Field(default=100, ge=0, le=1_000_000)
    """After resuming, the LR ramps linearly from 0 to the new scale over this many steps."""
    no_checkpoint_far_enough: NoCheckpointDecision = NoCheckpointDecision.NARROW_MARGIN
    """When no checkpoint lies far enough back: NarrowMargin (default), FromScratch or Fail.
    The pods never restore a step at or after the onset."""


class ReduceLRParams(ApiModel):
    """How a live ReduceLR changes the running pods."""

    lr_factor: Ratio = 0.5
    """The LR scale is multiplied by this, live, without a restart."""
    lr_floor: Floor = 0.05
    """The LR scale never drops below this."""


class RecoveryRule(ApiModel):
    """One rule: first matching rule in order wins, as in jobset's failure policy."""

    model_config = ConfigDict(
        json_schema_extra=kubernetes_rules(
            (
                "!has(self.rollback) || self.action == 'Rollback'",
                "rollback parameters are only allowed on a rule whose action is Rollback",
                ".rollback",
            ),
            (
                "!has(self.reduceLR) || self.action == 'ReduceLR'",
                "reduceLR parameters are only allowed on a rule whose action is ReduceLR",
                ".reduceLR",
            ),
        )
    )

    name: str = Field(pattern=NAME_PATTERN, max_length=63)
    """Unique within the list; shown in Events, conditions and the rollback history."""
    on_signals: tuple[SignalName, ...] = Field(min_length=1, max_length=16)
    """Matches when the signal that tripped (or fires, for report-only signals) is one of these."""
    on_classes: tuple[AnomalyClass, ...] = Field(default=(), max_length=5)
    """And, if set, its attribution class is one of these."""
    while_firing: tuple[SignalName, ...] = Field(default=(), max_length=8)
    """And, if set, every one of these signals fires at the same step: compound conditions
    such as `custom:entropy_low` while `custom:reward_jump` (reward hacking)."""
    action: Action
    rollback: RollbackParams | None = None
    """Only for Rollback; absent means the defaults below."""
    reduce_lr: ReduceLRParams | None = Field(default=None, alias="reduceLR")
    """Only for ReduceLR; absent means the defaults below."""

    @model_validator(mode="after")
    def _params_match_action(self) -> Self:
        if self.rollback is not None and self.action is not Action.ROLLBACK:
            raise ValueError(
                "rollback parameters are only allowed on a rule whose action is Rollback"
            )
        if self.reduce_lr is not None and self.action is not Action.REDUCE_LR:
            raise ValueError(
                "reduceLR parameters are only allowed on a rule whose action is ReduceLR"
            )
        return self

    def rollback_params(self) -> RollbackParams:
        return self.rollback or RollbackParams()

    def reduce_lr_params(self) -> ReduceLRParams:
        return self.reduce_lr or ReduceLRParams()


def default_rules() -> tuple[RecoveryRule, ...]:
    """The default policy, documented with its evidence in docs/api.md.

    Numerical faults and sustained loss spikes roll back (what the OPT-175B, BLOOM and PaLM
    teams did by hand); crashed or stalled workers restart from the latest checkpoint with
    nothing else changed (the fault is not the model's); grad-norm spikes and throughput
    drops are reported, because on their own they are usually harmless.
    """
    return (
        RecoveryRule(name="non-finite", on_signals=(Signal.NON_FINITE,), action=Action.ROLLBACK),
        RecoveryRule(name="loss-spike", on_signals=(Signal.LOSS_SPIKE,), action=Action.ROLLBACK),
        RecoveryRule(
            name="infrastructure",
            on_signals=(Signal.WORKER_FAILURE, Signal.STALLED),
            action=Action.RESTART_FROM_LATEST,
        ),
        RecoveryRule(
            name="report-only",
            on_signals=(Signal.GRAD_NORM_SPIKE, Signal.THROUGHPUT_DROP),
            action=Action.ALERT,
        ),
    )


class EscalationSpec(ApiModel):
    """What happens when a spike (or a NaN) recurs near the same step after a rollback."""

    within_steps: int = Field(default=1000, ge=0, le=10_000_000)
    """A new onset within this many steps of an earlier rollback's onset of the same kind is
    a recurrence: non-finite values and loss or gradient jumps are told apart."""
    max_recurrences: int = Field(default=2, ge=0, le=100)
    """Recurrences handled by a harder rollback (an older checkpoint, the LR factor applied
    again, the skip range doubled) before the final action."""
    final_action: Literal[Action.FAIL, Action.ALERT] = Action.FAIL
    """Fail (default) or Alert (keep the run going without further automatic changes)."""


class BudgetsSpec(ApiModel):
    """Caps on automatic actions; numerical and infrastructure faults are counted apart so a
    flaky node cannot use up the rollbacks a real divergence needs."""

    max_rollbacks: int = Field(default=5, ge=0, le=1000)
    """Rollbacks (automatic and manual) before the job fails with RollbackBudgetExhausted."""
    max_restarts: int = Field(default=10, ge=0, le=1000)
    """RestartFromLatest actions before the job fails with RestartBudgetExhausted."""
    cooldown_seconds: int = Field(default=300, ge=0, le=86_400)
    """Minimum time between two live actions (ReduceLR, Alert) of one rule, so a signal that
    keeps firing while a change takes effect does not halve the LR every scrape. After a
    Rollback or RestartFromLatest, a scraped (not tripped) signal within this time is the old
    episode fading and is not acted on; trips, pod failures and NonFinite never wait."""


class SuspectPlacement(StrEnum):
    """How relaunched pods treat the nodes on the job's suspect list."""

    AVOID = "Avoid"
    """Required node anti-affinity while enough other nodes are Ready and schedulable for
    every pod, preferred otherwise (and preferred when the operator may not list nodes)."""
    PREFER_AWAY = "PreferAway"
    """Always only preferred: a suspect node is used when nothing else fits."""
    IGNORE = "Ignore"
    """Suspects are recorded but placement ignores them."""


class PlacementSpec(ApiModel):
    """Where a relaunch puts its pods, away from the nodes recent incidents point at."""

    suspects: SuspectPlacement = SuspectPlacement.AVOID
    suspect_seconds: int = Field(default=3600, ge=1, le=30 * 86_400)
    """A node stays on the suspect list this long after its last incident."""


class CrashLoopAction(StrEnum):
    FAIL = "Fail"
    """Stop retrying: the job fails with reason CrashLoop and the failure's own words."""
    BACKOFF = "Backoff"
    """Keep retrying, but wait crashLoop.backoffSeconds before each relaunch."""


class CrashLoopSpec(ApiModel):
    """A crash loop: every rank of an attempt failed before its first step, or the same
    error ended two attempts in a row."""

    action: CrashLoopAction = CrashLoopAction.FAIL
    """Fail (default) or Backoff."""
    backoff_seconds: int = Field(default=600, ge=1, le=86_400)
    """Wait before each relaunch with action Backoff."""


class RestartMode(StrEnum):
    IN_PLACE = "InPlace"
    """Keep the pods: the training processes stop and the next attempt starts in the same
    pods; only a pod that must go is replaced (see `recovery.restart`)."""
    RECREATE_PODS = "RecreatePods"
    """Delete every pod of the attempt and create the next attempt's."""


class RecoverySpec(ApiModel):
    """The policy: ordered rules, budgets, escalation, placement, crash loops."""

    rules: tuple[RecoveryRule, ...] = Field(
        default_factory=default_rules,
        max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Evaluated in order, first match wins; a signal no rule matches is only recorded.
    Setting this list replaces the whole default policy."""
    budgets: BudgetsSpec = Field(default_factory=BudgetsSpec)
    escalation: EscalationSpec = Field(default_factory=EscalationSpec)
    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    crash_loop: CrashLoopSpec = Field(default_factory=CrashLoopSpec)
    restart: RestartMode = RestartMode.IN_PLACE
    """How a Rollback or RestartFromLatest restarts training. InPlace (default): every worker
    container runs its command under the agent's supervisor (`stabletrain-supervisor --
    <command>`: the image must have the agent installed, and the training container must
    have a `command`); a recovery stops the training processes (TERM, the pod's grace
    period, KILL) and starts the next attempt in the same pods, with the pods' scheduling,
    volumes and node-local state kept. A pod is replaced only when it must go: its node is
    lost or silent, or a suspect of repeated incidents (its second within suspectSeconds)
    the relaunch avoids; it was evicted, OOM-killed or its container ended; its processes
    did not stop within the grace period plus 10 s; or what it was built from changed since
    it was created (workers, the tiers' volumes, checkpoints.memory, warmStart, the
    operator's agent port).
    RecreatePods deletes every pod and creates the next attempt's, as a restart did before
    InPlace existed. A template whose training container has no `command` (the image's
    entrypoint runs) cannot be wrapped and restarts as RecreatePods (the Relaunched Event
    says so)."""
    warm_start: bool = True
    """With restart InPlace: the supervisor keeps a standby torchrun for the next attempt,
    with torchrun and one standby worker per process already started and their imports
    done (torch, `torch._dynamo`, the agent), so a restart skips the interpreters' cold
    start. The standbys idle in the pod's memory (about one interpreter with torch imported
    per process, plus one for torchrun) and count against its limit; false starts every
    attempt cold. Takes effect in pods created after the change (a pod-shaping field: the
    next recovery replaces the pods)."""
    confirm_timeout_seconds: int = Field(default=10_800, ge=60, le=7 * 86_400)
    """How long after a rollback's decision the run may take to pass the old onset plus the
    detection window with the signal quiet (phase Confirming). Past it the job goes back to
    Running unconfirmed: condition Recovering=False with reason ConfirmationTimedOut and a
    Warning Event. 3 h by default: a large model may take that long to redo a few hundred
    steps."""

    @model_validator(mode="after")
    def _unique_names(self) -> Self:
        names = [rule.name for rule in self.rules]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"rule names must be unique, repeated: {', '.join(duplicates)}")
        return self


class ManualRollbackSpec(ApiModel):
    """A person's rollback request; runs once per requestId (status.lastManualRequestId)."""

    request_id: str = Field(min_length=1, max_length=63, pattern=NAME_PATTERN)
    """Any new value requests one more rollback; the operator records the id once it ran."""
    to_step: int | None = Field(default=None, ge=0)
    """Newest stable checkpoint at or before this step; null means the newest stable one."""
    lr_factor: Ratio | None = None
    """Multiply the LR scale by this; null keeps it."""
    skip: tuple[SkipRange, ...] = Field(default=(), max_length=SKIPS_PER_ACTION)
    """Data to skip in addition to the active ranges (at most 8: what a plan and a history
    entry hold)."""
    reason: str = Field(default="", max_length=256)
    """Free text recorded in the rollback history and the Event."""


class PreflightMode(StrEnum):
    """What a severe preflight finding does to a job."""

    WARN = "Warn"
    """Start anyway; the Preflight condition and a Warning Event name the findings."""
    REFUSE = "Refuse"
    """Run one short preflight pod first and create no worker pod while a severe finding
    stands (see docs/preflight.md)."""


class PreflightSpec(ApiModel):
    """The stability preflight: the run's start-up facts against known causes of spikes and
    lost work (docs/preflight.md lists every check and its source)."""

    mode: PreflightMode = PreflightMode.WARN
    """Warn (default) reports findings from the running pods; Refuse runs a preflight pod
    before any worker pod and starts none while a severe finding stands."""
    max_lost_steps: int | None = Field(default=None, ge=1, le=10_000_000)
    """Lost-work budget: the most optimizer steps a crash may cost (the checkpoint interval)
    or a rollback may rewind (the interval plus rollback.minStepsBeforeOnset). Null: no
    budget, not checked."""


class UnschedulableAction(StrEnum):
    """What a job does when pods of an attempt stay unschedulable past the bound."""

    WAIT = "Wait"
    """Keep every pod and wait for the scheduler; the Unschedulable condition and a Warning
    Event name the pods and the scheduler's reason."""
    RELEASE = "Release"
    """Stop every pod of the attempt, so the placed ones do not hold their nodes (and
    GPUs) idle while the rest wait (none has trained: the ranks wait for each other at the
    rendezvous), then try the whole attempt again after `unschedulableSeconds`. Counts
    against no budget."""


class SchedulingSpec(ApiModel):
    """Pods that cannot be scheduled. Without a queue that admits the job whole (Kueue), part
    of an attempt can be placed while the rest waits."""

    unschedulable_seconds: int = Field(default=300, ge=1, le=86_400)
    """How long pods of an attempt may stay unschedulable (since they were created) before
    the job says so (condition Unschedulable, a Warning Event, `kubectl get stj`'s
    UNSCHEDULABLE column) and `whenUnschedulable` applies."""
    when_unschedulable: UnschedulableAction = UnschedulableAction.WAIT
    """Wait (default: the scheduler places the pods when room appears; the job only says
    why it waits) or Release."""


class StableTrainingJobSpec(ApiModel):
    """A torchrun job and the policy that heals it."""

    model_config = ConfigDict(
        json_schema_extra=kubernetes_rules(
            (
                "!has(self.recovery) || !has(self.recovery.rules) || !has(self.detection)"
                " || !has(self.detection.custom)"
                " || self.recovery.rules.all(r, r.onSignals.all(s, !s.startsWith('custom:')"
                " || self.detection.custom.exists(c, 'custom:' + c.name == s))"
                " && (!has(r.whileFiring) || r.whileFiring.all(s, !s.startsWith('custom:')"
                " || self.detection.custom.exists(c, 'custom:' + c.name == s))))",
                "rules may only name custom signals that detection.custom defines",
                ".recovery.rules",
            ),
        )
    )

    workers: WorkersSpec
    checkpoints: Annotated[CheckpointsSpec, Shared()]
    detection: Annotated[DetectionConfig, Shared()] = Field(default_factory=DetectionConfig)
    recovery: Annotated[RecoverySpec, Shared()] = Field(default_factory=RecoverySpec)
    suspend: bool = False
    """True asks every pod for a final checkpoint (saved on the local tier and flushed to
    the PFS), then stops all pods once each saved it or after 120 s, without counting a
    fault (a rollback being confirmed is given up); false again relaunches from the newest
    checkpoint, stable or not: the final one, or an interval save the pods reached between
    it and their stop."""
    manual_rollback: ManualRollbackSpec | None = None
    preflight: Annotated[PreflightSpec, Shared()] = Field(default_factory=PreflightSpec)
    scheduling: Annotated[SchedulingSpec, Shared()] = Field(default_factory=SchedulingSpec)

    @model_validator(mode="after")
    def _custom_signals_defined(self, info: ValidationInfo) -> Self:
        if as_written(info):
            return self  # its policy's detection.custom may define them; the effective spec says
        defined = self.detection.custom_signal_names()
        for rule in self.recovery.rules:
            for signal in (*rule.on_signals, *rule.while_firing):
                if signal.startswith(CUSTOM_SIGNAL_PREFIX) and signal not in defined:
                    raise ValueError(
                        f"rule {rule.name} names {signal}, which detection.custom does not define"
                    )
        return self
