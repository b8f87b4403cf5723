"""The chaos plan: seeded, every kind at least once, the pairs that must overlap."""

from __future__ import annotations

import itertools

import pytest

from support.chaos.schedule import ALL_KINDS, expected_action, explicit_schedule, make_schedule


def test_a_fifteen_minute_plan_has_every_kind_and_both_overlapping_pairs() -> None:
    plan = make_schedule(7, (40.0, 690.0), 120.0)
    assert {p.kind for p in plan} == set(ALL_KINDS)
    by_index = {p.index: p for p in plan}
    pairs = [(by_index[p.follows].kind, p.kind, p.after) for p in plan if p.follows is not None]
    assert any(first in ("spike", "nan") and (second, after) == ("operator-kill", "recovering")
               for first, second, after in pairs), pairs  # fmt: skip
    assert any(first == "corrupt-checkpoint" and second in ("kill", "lost-node") and after == "next"
               for first, second, after in pairs), pairs  # fmt: skip
    singles = [p.at for p in plan if p.follows is None]
    assert singles == sorted(singles)
    assert singles[0] >= 40.0
    assert singles[-1] <= 690.0
    assert sum(p.kind in ("spike", "nan") for p in plan) == 2, "numerical faults are not repeated"


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    first = make_schedule(3, (40.0, 900.0), 120.0)
    assert make_schedule(3, (40.0, 900.0), 120.0) == first
    assert make_schedule(4, (40.0, 900.0), 120.0) != first


def test_a_long_window_is_filled_at_about_the_interval() -> None:
    plan = make_schedule(1, (0.0, 3600.0), 120.0)
    groups = [p for p in plan if p.follows is None]
    assert len(groups) == 31
    gaps = [b.at - a.at for a, b in itertools.pairwise(groups)]
    assert all(59.9 <= gap <= 180.1 for gap in gaps), gaps


def test_a_window_too_short_for_every_kind_squeezes_the_gaps() -> None:
    plan = make_schedule(2, (10.0, 100.0), 120.0)
    assert {p.kind for p in plan} == set(ALL_KINDS)
    assert max(p.at for p in plan) <= 100.0 + 1e-6


def test_an_explicit_plan_and_its_errors() -> None:
    plan = explicit_schedule([("kill", 20), ("nan", 60), ("operator-kill", "recovering")])
    assert [(p.kind, p.follows, p.after) for p in plan] == [
        ("kill", None, ""), ("nan", None, ""), ("operator-kill", 1, "recovering"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="follow another fault"):
        explicit_schedule([("kill", "next")])
    with pytest.raises(ValueError, match="unknown fault kind 'flood'"):
        explicit_schedule([("flood", 3)])
    with pytest.raises(ValueError, match="empty"):
        make_schedule(1, (50.0, 50.0), 120.0)


def test_the_action_each_kind_expects() -> None:
    assert [expected_action(k) for k in ("spike", "nan", "kill", "hang", "lost-node")] == [
        "Rollback", "Rollback", "RestartFromLatest", "RestartFromLatest", "RestartFromLatest",
    ]  # fmt: skip
    quiet = ("pfs-readonly", "operator-kill", "apiserver-restart", "corrupt-checkpoint")
    assert not any(expected_action(k) for k in quiet)
