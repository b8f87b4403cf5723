from __future__ import annotations

from datetime import UTC, datetime

import pytest

from stabletrain_agent.checkpoint.inventory_scan import merge_records
from stabletrain_agent.checkpoint.selection import NoCheckpointError, select_checkpoint
from stabletrain_agent.contract.checkpoint_inventory import CheckpointRecord, NodeCopy, TierCopy

NODES = ("n0", "n1")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(
    step: int,
    *,
    pfs: bool = True,
    local: tuple[str, ...] = NODES,
    stable: bool = True,
    marker: bool = False,
    attempt: int = 1,
) -> CheckpointRecord:
    return CheckpointRecord(
        step=step,
        attempt=attempt,
        stable=stable,
        spike_marker=marker,
        saved_at=T0,
        pfs=TierCopy(complete=pfs, verified=pfs),
        local=tuple(NodeCopy(node=n, complete=True, verified=True) for n in local),
    )


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
