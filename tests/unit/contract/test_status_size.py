"""What a status body weighs: the operator reads no more than MAX_STATUS_BYTES of one.

The cap must hold the largest status a correct agent can serve (every list full, every
string at its bound; node names are DNS names, text is ASCII; each checkpoint lists the
pod's own node's copy only), or the operator would go blind to a healthy pod; and it is
measured against what a pod of a real 1,000-rank job serves. Both figures are printed.
"""

from __future__ import annotations

from datetime import UTC, datetime

from stabletrain_contract.channel import (
    COPY_PATH_MAX,
    FRAME_MAX,
    MAX_STATUS_BYTES,
    PFS_MESSAGE_MAX,
    PROBLEM_MAX,
    REJECTED_MAX,
    STATUS_FIRING_MAX,
    AgentStatus,
    FindingReport,
    Heartbeat,
    RejectedCopy,
    ThreadPlace,
)
from stabletrain_contract.checkpoint.inventory import (
    INVENTORY_MAX,
    NODE_NAME_MAX,
    CheckpointRecord,
    NodeCopy,
    TierCopy,
    compact_inventory,
)
from stabletrain_contract.directives import SHARD_ID_MAX
from stabletrain_contract.names import AnomalyClass
from stabletrain_contract.preflight import (
    OptimizerFacts,
    Precision,
    PreflightFacts,
    TierFacts,
)
from stabletrain_contract.trip_report import (
    EVIDENCE_MAX,
    FIRING_MAX,
    LINEAGE_PATH_MAX,
    SUSPECT_SHARDS_MAX,
    TripReport,
    parse_termination_message,
    render_termination_message,
)

AT = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
BIG = 10**15


def records(count: int, node: str, first: int = BIG) -> tuple[CheckpointRecord, ...]:
    return tuple(
        CheckpointRecord(
            step=first + 100 * i, attempt=BIG, stable=True, spike_marker=False, saved_at=AT,
            pfs=TierCopy(complete=True, verified=True),
            local=(NodeCopy(node=node, complete=True, verified=True),),
        )
        for i in range(count)
    )  # fmt: skip


def status(
    *, node: str, inventory: int, firing: int, evidence: int, shards: int, shard_id: int,
    rejected: int, path: int, world_size: int,
) -> AgentStatus:  # fmt: skip
    held = records(inventory, node)
    trip = TripReport(
        attempt=BIG, node=node, step=BIG, tripped_at=AT, signal="LossSpike",
        anomaly_class=AnomalyClass.BAD_BATCH, evidence="e" * evidence, value=1e300,
        threshold=1e300, onset_step=BIG, last_good_step=BIG,
        firing=tuple(f"custom:c{i:02d}" + "x" * 60 for i in range(min(firing, FIRING_MAX))),
        inventory=compact_inventory(held, node),
        lineage_path="/" + "l" * (min(path, LINEAGE_PATH_MAX) - 1),
        suspect_shards=tuple(f"{i:04d}" + "s" * (shard_id - 4) for i in range(shards)),
    )  # fmt: skip
    return AgentStatus(
        attempt=BIG, node=node, node_rank=BIG, updated_at=AT, step=BIG, loss=1e300,
        loss_baseline=1e300, grad_norm=1e300, grad_norm_baseline=1e300, lr_scale=1.0,
        tokens_per_second=1e300, applied_generation=2**31 - 1,
        firing=tuple(
            FindingReport(
                signal=f"custom:c{i:02d}" + "x" * 60, anomaly_class=AnomalyClass.DIVERGENCE,
                value=1e300, threshold=1e300, onset_step=BIG, consecutive=BIG, sustained=True,
                evidence="e" * evidence,
            )
            for i in range(firing)
        ),
        inventory=held, pfs_available=False, pfs_message="p" * min(path, PFS_MESSAGE_MAX),
        latest_trip=parse_termination_message(render_termination_message(trip)),
        preflight=PreflightFacts(
            max_grad_norm=1.0, warmup_steps=BIG, scheduler="s" * 128, peak_lr=1e300,
            precision=Precision.BF16, optimizer=OptimizerFacts(
                name="o" * 128, adaptive=True, beta1=0.9, beta2=0.95, eps=1e-8,
                weight_decay=0.1, state_dtype="d" * 32,
            ),
            parameters=BIG, checkpoint_bytes_estimate=BIG, checkpoint_interval_steps=BIG,
            tiers=tuple(TierFacts(name=n, path="/" + "t" * (path - 1), free_bytes=BIG,
                                  total_bytes=BIG) for n in ("local", "pfs")),
            data_shards=BIG, world_size=world_size,
        ),
        heartbeat=Heartbeat(
            rank=BIG, started_at=AT, training_since=AT, steps_completed=BIG, last_step=BIG,
            last_step_at=AT, slowest_step_seconds=1e300, in_step=True, place=ThreadPlace.TORCH,
            frame="f" * FRAME_MAX,
        ),
        saved_request=BIG, saved_step=BIG,
        rejected=tuple(
            RejectedCopy(path="/" + "r" * (COPY_PATH_MAX - 1), problem="q" * PROBLEM_MAX,
                         quarantined_as="/" + "r" * (COPY_PATH_MAX - 1))
            for _ in range(rejected)
        ),
    )  # fmt: skip


def test_the_cap_holds_the_largest_status_and_a_real_one_is_far_below_it() -> None:
    largest = status(
        node="n" * NODE_NAME_MAX, inventory=INVENTORY_MAX, firing=STATUS_FIRING_MAX,
        evidence=EVIDENCE_MAX, shards=SUSPECT_SHARDS_MAX, shard_id=SHARD_ID_MAX,
        rejected=REJECTED_MAX, path=4096, world_size=10_000 * 1024,
    )  # fmt: skip
    # A pod of a 1,000-rank job (125 pods of 8 ranks) as it trips: the default retention
    # (3 per tier, 2 spike markers) lists about 6 checkpoints; two signals fire; the trip
    # names the usual 8 suspect shards; nothing was refused.
    real = status(
        node="ip-10-42-113-207.eu-west-1.compute.internal", inventory=6, firing=2,
        evidence=160, shards=8, shard_id=48, rejected=0, path=40, world_size=1000,
    )  # fmt: skip
    largest_bytes = len(largest.model_dump_json().encode())
    real_bytes = len(real.model_dump_json().encode())
    print(
        f"\nstatus body: the largest a correct agent serves {largest_bytes} bytes, a pod of a "
        f"1,000-rank job {real_bytes} bytes; the operator reads at most {MAX_STATUS_BYTES}"
    )
    assert largest_bytes <= MAX_STATUS_BYTES
    assert real_bytes * 8 <= MAX_STATUS_BYTES
