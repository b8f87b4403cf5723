from __future__ import annotations

import pytest

from stabletrain_agent.checkpoint.retention import RetentionItem, plan_deletions


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
