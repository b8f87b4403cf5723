from __future__ import annotations

import pytest

from stabletrain_contract.checkpoint.retention import RetentionItem, copies_within, plan_deletions


def item(
    step: int, *, stable: bool = True, marker: bool = False, live: bool = True
) -> RetentionItem:
    return RetentionItem(step, 1, stable, marker, live)


def test_keeps_latest_k() -> None:
    items = [item(s) for s in (100, 200, 300, 400)]
    assert plan_deletions(items, keep=2) == [(100, 1), (200, 1)]


def test_never_deletes_rollback_target_or_newest_stable() -> None:
    items = [item(100), item(200), item(300, stable=False), item(400, stable=False)]
    deleted = plan_deletions(items, keep=2, protected={(100, 1)})
    assert deleted == []  # 100 is the target, 200 the newest stable, 300/400 the latest two


def test_at_most_three_spike_markers_and_they_do_not_count_as_regular() -> None:
    markers = [item(s, stable=False, marker=True) for s in (110, 120, 130, 140)]
    deleted = plan_deletions([item(100), item(200), *markers], keep=2)
    assert deleted == [(110, 1)]


def test_abandoned_trajectory_is_deleted_unless_protected() -> None:
    items = [item(100), item(200), item(300, live=False)]
    assert plan_deletions(items, keep=2) == [(300, 1)]


def test_keep_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="keep must be >= 2"):
        plan_deletions([], keep=1)


def marker(step: int, episode: int | None, *, attempt: int = 1, live: bool = True) -> RetentionItem:
    return RetentionItem(step, attempt, False, True, live, episode)


def test_the_earliest_markers_of_an_episode_are_kept() -> None:
    markers = [marker(s, 130) for s in (130, 135, 140, 145)]
    deleted = plan_deletions([item(100), item(125), *markers], keep=2, max_spike_markers=2)
    assert deleted == [(140, 1), (145, 1)]


def test_a_newer_episode_wins_over_an_older_one() -> None:
    old = [marker(s, 130) for s in (130, 135)]
    new = [marker(s, 260) for s in (260, 265)]
    deleted = plan_deletions([item(100), item(250), *old, *new], keep=2, max_spike_markers=3)
    assert deleted == [(135, 1)]  # all of the newest episode, then the older one's earliest


def test_markers_off_the_lineage_are_evidence_and_stay() -> None:
    abandoned = marker(130, 130, attempt=0, live=False)
    assert plan_deletions([item(25), item(50), abandoned], keep=2, max_spike_markers=1) == []


def test_zero_spike_markers_keeps_none() -> None:
    deleted = plan_deletions([item(100), item(200), marker(210, 210)], keep=2, max_spike_markers=0)
    assert deleted == [(210, 1)]


def test_a_size_budget_drops_markers_and_older_copies_but_never_below_two() -> None:
    items = [item(s) for s in (100, 200, 300, 400)] + [marker(410, 410)]
    assert plan_deletions(items, keep=4, max_spike_markers=1, max_copies=3) == [
        (100, 1),
        (410, 1),
    ]
    assert plan_deletions(items, keep=4, max_spike_markers=1, max_copies=0) == [
        (100, 1),
        (200, 1),
        (410, 1),
    ]


def test_copies_waiting_for_the_pfs_come_before_older_copies_within_the_budget() -> None:
    items = [item(s) for s in (100, 200, 300, 400)]
    assert plan_deletions(items, keep=4, waiting=[(100, 1)], max_copies=3) == [(200, 1)]
    assert plan_deletions(items, keep=2, waiting=[(100, 1)]) == [(200, 1)]


def test_copies_within_leaves_room_for_the_save_being_written() -> None:
    assert copies_within(10 * 100, 100) == 9
    assert copies_within(250, 100) == 1
    assert copies_within(50, 100) == 0
    with pytest.raises(ValueError, match="copy size > 0"):
        copies_within(100, 0)


def test_while_the_pfs_lags_the_newest_copy_on_it_stays_in_place_of_the_oldest() -> None:
    items = [item(s) for s in (100, 200, 300, 400, 500)]
    waiting_for_pfs = {(300, 1), (400, 1), (500, 1)}
    deleted = plan_deletions(items, keep=3, unreplicated=waiting_for_pfs)
    assert deleted == [(100, 1), (300, 1)]  # 400, 500 newest; 200 newest on both tiers


def test_the_minimum_retention_keeps_the_two_newest_only() -> None:
    items = [item(s, stable=False) for s in (100, 200, 300, 400)]
    deleted = plan_deletions(items, keep=2, unreplicated={(300, 1), (400, 1)})
    assert deleted == [(100, 1), (200, 1)]


def test_without_a_pfs_or_with_it_current_the_retention_is_unchanged() -> None:
    items = [item(s) for s in (100, 200, 300, 400)]
    assert plan_deletions(items, keep=3, unreplicated=None) == [(100, 1)]
    assert plan_deletions(items, keep=3, unreplicated=set()) == [(100, 1)]
    assert plan_deletions(items, keep=3, unreplicated={(400, 1)}) == [(100, 1)]


def test_a_size_budget_drops_the_copy_on_both_tiers_before_a_copy_only_here() -> None:
    items = [item(s, stable=False) for s in (100, 200, 300, 400)]
    unreplicated = {(200, 1), (300, 1), (400, 1)}
    deleted = plan_deletions(
        items, keep=3, waiting=[(200, 1), (300, 1), (400, 1)], unreplicated=unreplicated,
        max_copies=3,
    )  # fmt: skip
    assert deleted == [(100, 1)]
