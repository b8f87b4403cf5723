from __future__ import annotations

from datetime import UTC, datetime

import pytest

from stabletrain_contract.checkpoint.inventory import (
    CheckpointRecord,
    NodeCopy,
    PodCopy,
    TierCopy,
)
from stabletrain_contract.checkpoint.inventory_merge import merge_records
from stabletrain_contract.checkpoint.selection import NoCheckpointError, select_checkpoint

NODES = ("n0", "n1")
PODS = ("job-a3-0", "job-a3-1")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(
    step: int,
    *,
    pfs: bool = True,
    local: tuple[str, ...] = NODES,
    stable: bool = True,
    marker: bool = False,
    attempt: int = 1,
    memory: tuple[str, ...] = (),
    memory_verified: bool = True,
) -> CheckpointRecord:
    return CheckpointRecord(
        step=step,
        attempt=attempt,
        stable=stable,
        spike_marker=marker,
        saved_at=T0,
        pfs=TierCopy(complete=pfs, verified=pfs),
        local=tuple(NodeCopy(node=n, complete=True, verified=True) for n in local),
        memory=tuple(PodCopy(pod=p, complete=True, verified=memory_verified) for p in memory),
    )


def snapshot(step: int, pods: tuple[str, ...] = PODS, **options: bool) -> CheckpointRecord:
    """A step only the memory tier of `pods` holds."""
    return record(step, pfs=False, local=(), memory=pods, **options)


def test_newest_pre_spike_complete_everywhere_is_read_locally() -> None:
    chosen = select_checkpoint(
        [record(100), record(200), record(300)], onset_step=320, margin=10, nodes=NODES
    )
    assert (chosen.step, chosen.source) == (300, "local")


def test_margin_excludes_a_checkpoint_too_close_to_the_onset() -> None:
    chosen = select_checkpoint([record(100), record(200)], onset_step=205, margin=10, nodes=NODES)
    assert chosen.step == 100


def test_newest_pre_spike_without_pfs_copy_falls_back_to_older_complete_one() -> None:
    records = [record(100), record(200), record(300, pfs=False)]
    chosen = select_checkpoint(records, onset_step=350, margin=10, nodes=NODES)
    assert (chosen.step, chosen.source) == (200, "local")
    assert "step 300 (not verified on the PFS)" in chosen.reason


def test_pfs_only_copy_is_chosen_and_nodes_reseed() -> None:
    records = [record(100), record(200, local=("n0",))]
    chosen = select_checkpoint(records, onset_step=250, margin=0, nodes=NODES)
    assert (chosen.step, chosen.source) == (200, "pfs")
    assert "nodes n1 re-seed" in chosen.reason


def test_a_node_the_run_moves_to_has_no_local_copy() -> None:
    chosen = select_checkpoint([record(100)], onset_step=150, margin=0, nodes=("n0", "n9"))
    assert chosen.source == "pfs"


def test_unstable_and_spike_markers_are_never_targets() -> None:
    records = [record(100), record(200, stable=False), record(210, marker=True, stable=False)]
    chosen = select_checkpoint(records, onset_step=300, margin=0, nodes=NODES)
    assert chosen.step == 100


def test_a_restart_takes_the_newest_checkpoint_stable_or_not_but_never_a_marker() -> None:
    records = [record(100), record(200, stable=False), record(210, marker=True, stable=False)]
    chosen = select_checkpoint(records, onset_step=300, margin=0, nodes=NODES, stable_only=False)
    assert chosen.step == 200
    with pytest.raises(NoCheckpointError, match="no checkpoint at or before step 300"):
        select_checkpoint(
            [record(210, marker=True)], onset_step=300, margin=0, nodes=NODES, stable_only=False
        )


def test_no_candidate_fails_with_reason() -> None:
    with pytest.raises(NoCheckpointError, match=r"at or before step 90 .*step 50 \(not verified"):
        select_checkpoint(
            [record(50, pfs=False), record(200)], onset_step=100, margin=10, nodes=NODES
        )
    with pytest.raises(NoCheckpointError, match="no stable checkpoint"):
        select_checkpoint([], onset_step=100, margin=10, nodes=NODES)


def test_deterministic_whatever_the_input_order() -> None:
    records = [record(100), record(200, attempt=1), record(200, attempt=2), record(150)]
    first = select_checkpoint(records, onset_step=300, margin=0, nodes=NODES)
    second = select_checkpoint(list(reversed(records)), onset_step=300, margin=0, nodes=NODES)
    assert first == second
    assert (first.step, first.attempt) == (200, 2)


def test_merged_node_reports_feed_the_selection() -> None:
    n0 = [record(100, local=("n0",)), record(200, local=("n0",), pfs=False)]
    n1 = [record(100, local=("n1",), pfs=False), record(200, local=("n1",))]
    merged = merge_records([n0, n1])
    assert [(r.step, r.pfs.verified, [c.node for c in r.local]) for r in merged] == [
        (100, True, ["n0", "n1"]),
        (200, True, ["n0", "n1"]),
    ]
    chosen = select_checkpoint(merged, onset_step=300, margin=0, nodes=NODES)
    assert (chosen.step, chosen.source) == (200, "local")


# --- the memory tier (a restart from the latest whose pods are kept) -------------------------


def restart(records: list[CheckpointRecord], memory_pods: tuple[str | None, ...] = PODS) -> object:
    return select_checkpoint(
        records,
        onset_step=10_000,
        margin=0,
        nodes=NODES,
        stable_only=False,
        memory_pods=memory_pods,
    )


def test_a_snapshot_every_kept_pod_holds_is_restored_from_memory() -> None:
    chosen = select_checkpoint(
        [record(25), snapshot(30)],
        onset_step=10_000,
        margin=0,
        nodes=NODES,
        stable_only=False,
        memory_pods=PODS,
    )
    assert (chosen.step, chosen.source) == (30, "memory")
    assert "every rank restores from memory" in chosen.reason
    assert "job-a3-0, job-a3-1" in chosen.reason


def test_without_kept_pods_memory_is_never_chosen() -> None:
    """The default: no pod is kept (every pod is recreated), so no memory tier survives."""
    chosen = select_checkpoint(
        [record(25), snapshot(30)], onset_step=10_000, margin=0, nodes=NODES, stable_only=False
    )
    assert (chosen.step, chosen.source) == (25, "local")
    assert "step 30 (in pod memory only)" in chosen.reason


def test_a_replaced_pod_has_no_memory_the_restart_falls_back_to_the_pfs() -> None:
    """Pod 1 is replaced (None): its memory is gone, so step 30 cannot be restored on every
    rank; the newest checkpoint on the PFS is taken, as without the tier."""
    chosen = restart([record(25), snapshot(30)], memory_pods=("job-a3-0", None))
    assert chosen.step == 25
    assert chosen.source == "local"


def test_a_kept_pod_that_lacks_the_snapshot_falls_back_to_the_pfs() -> None:
    chosen = restart([record(25), snapshot(30, pods=("job-a3-0",))])
    assert chosen.step == 25


def test_a_snapshot_that_does_not_verify_is_never_chosen() -> None:
    chosen = restart([record(25), snapshot(30, memory_verified=False)])
    assert chosen.step == 25


def test_a_snapshot_of_another_attempts_pods_is_not_the_kept_pods_memory() -> None:
    """The kept pods are named: a snapshot another pod (a replaced one) reported is no
    copy in the memory of the pods that run the next attempt."""
    chosen = restart([record(25), snapshot(30, pods=("job-a2-0", "job-a2-1"))])
    assert chosen.step == 25


def test_memory_never_revives_a_spike_marker_or_a_step_past_the_bound() -> None:
    records = [record(25), snapshot(30, marker=True, stable=False), snapshot(40)]
    chosen = select_checkpoint(
        records, onset_step=35, margin=0, nodes=NODES, stable_only=False, memory_pods=PODS
    )
    assert chosen.step == 25


def test_a_rollback_keeps_to_stable_checkpoints_even_in_memory() -> None:
    """A stable-only choice takes no unstable snapshot (the memory tier never overrides the
    verdict rules, only the PFS one)."""
    chosen = select_checkpoint(
        [record(25), snapshot(30, stable=False)],
        onset_step=10_000,
        margin=0,
        nodes=NODES,
        memory_pods=PODS,
    )
    assert chosen.step == 25


def test_a_pfs_step_kept_pods_hold_in_memory_says_they_read_it_from_there() -> None:
    chosen = restart(
        [record(25, local=("n0",), memory=("job-a3-1",))], memory_pods=("job-a3-0", "job-a3-1")
    )
    assert (chosen.step, chosen.source) == (25, "pfs")
    assert "nodes n1 re-seed" in chosen.reason
    assert "pods job-a3-1 read it from their memory tier" in chosen.reason


def test_both_tiers_never_goes_back_further_for_a_memory_snapshot() -> None:
    """BothTiers passed over a newer PFS-only step: an older snapshot in memory would cost
    more steps than the PFS copy, so the PFS copy is taken."""
    records = [snapshot(30), record(40, local=("n0",))]
    chosen = select_checkpoint(
        records,
        onset_step=10_000,
        margin=0,
        nodes=NODES,
        both_tiers=True,
        stable_only=False,
        memory_pods=PODS,
    )
    assert (chosen.step, chosen.source) == (40, "pfs")


def test_merged_reports_union_the_pods_memory_copies() -> None:
    pod0 = [snapshot(30, pods=("job-a3-0",))]
    pod1 = [snapshot(30, pods=("job-a3-1",))]
    (merged,) = merge_records([pod0, pod1])
    assert [c.pod for c in merged.memory] == list(PODS)
    assert restart([record(25), merged]).source == "memory"
