"""The tiny GPT's trigger files (examples/tiny-gpt/triggers.py): a fault the chaos harness
asks for strikes once in the whole run, on the rank it names, whatever replays the steps;
a poisoned shard stays poisoned for every rank and attempt; an unchanged directory costs a
stat. The triggers are written by the harness's own writer (support.chaos.inject), so the
two sides are tested against each other."""

from __future__ import annotations

import errno
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from support.chaos.inject import read_marker, write_trigger

TRIGGERS = Path(__file__).resolve().parents[2] / "examples" / "tiny-gpt" / "triggers.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tiny_gpt_triggers", TRIGGERS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


triggers = _load()


def box(directory: Path, rank: int, attempt: int = 0, **kwargs: Any) -> Any:
    warnings: list[str] = []
    made = triggers.TriggerBox(directory, rank, attempt, warn=warnings.append, **kwargs)
    made.warnings = warnings
    return made


def no_shard() -> str:
    raise AssertionError("only a spike asks for the next shard")


def test_the_named_rank_fires_once_and_no_later_attempt_fires_again(tmp_path: Path) -> None:
    write_trigger(tmp_path, "0001-nan", {"kind": "nan", "rank": 1, "steps": 4})
    other, named = box(tmp_path, 0), box(tmp_path, 1, clock=lambda: 12.5)
    assert other.due(40, no_shard) == []
    (fired,) = named.due(40, no_shard)
    assert (fired.kind, fired.rank, fired.step, fired.attempt, fired.steps) == ("nan", 1, 40, 0, 4)
    assert named.due(41, no_shard) == [], "claimed once, gone from the pending ones"
    relaunched = box(tmp_path, 1, attempt=1)
    assert relaunched.due(26, no_shard) == [], "the replayed steps do not fire it again"
    assert relaunched.due(40, no_shard) == []
    marker = read_marker(tmp_path, "0001-nan")
    assert marker == {"kind": "nan", "rank": 1, "step": 40, "attempt": 0, "time": 12.5,
                      "shard": None, "steps": 4}  # fmt: skip


def test_two_processes_that_both_see_a_trigger_claim_it_exactly_once(tmp_path: Path) -> None:
    """A stale rank of an old attempt and the new one: the hard link lets only one win."""
    write_trigger(tmp_path, "0002-hang", {"kind": "hang", "rank": 0})
    stale, fresh = box(tmp_path, 0, attempt=0), box(tmp_path, 0, attempt=1)
    stale.scan()
    fresh.scan()
    results = [stale.due(10, no_shard), fresh.due(3, no_shard)]
    assert sorted(len(r) for r in results) == [0, 1]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temp left"


def test_an_unchanged_directory_costs_one_stat_and_no_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher = box(tmp_path, 0)
    watcher.due(1, no_shard)
    listings = []
    real = os.listdir
    monkeypatch.setattr(triggers.os, "listdir", lambda path: listings.append(path) or real(path))
    for step in range(2, 50):
        watcher.due(step, no_shard)
    assert listings == []
    write_trigger(tmp_path, "0003-nan", {"kind": "nan", "rank": 0})
    (fired,) = watcher.due(50, no_shard)
    assert fired.step == 50
    assert len(listings) >= 1


def test_a_spike_poisons_the_shard_read_next_for_every_rank_and_attempt(tmp_path: Path) -> None:
    write_trigger(tmp_path, "0004-spike", {"kind": "spike", "rank": 1})
    other, named = box(tmp_path, 0), box(tmp_path, 1)
    assert other.due(7, no_shard) == []
    (fired,) = named.due(7, lambda: "shard-0003")
    assert fired.shard == "shard-0003"
    assert named.poisoned_shards() == {"shard-0003"}
    other.due(8, no_shard)
    assert other.poisoned_shards() == {"shard-0003"}, "the other rank learns it a step later"
    later = box(tmp_path, 0, attempt=2)
    later.scan()
    assert later.poisoned_shards() == {"shard-0003"}, "bad data stays bad"


def test_a_claim_the_pfs_refuses_is_retried_and_fires_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_trigger(tmp_path, "0005-nan", {"kind": "nan", "rank": 0})
    watcher = box(tmp_path, 0)
    real_link = os.link

    def read_only(source: Any, target: Any) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(triggers.os, "link", read_only)
    assert watcher.due(5, no_shard) == []
    assert watcher.due(6, no_shard) == []
    (warning,) = watcher.warnings
    assert "Read-only file system" in warning, "said once, not at every step"
    assert not (tmp_path / "0005-nan.fired").exists()
    monkeypatch.setattr(triggers.os, "link", real_link)
    (fired,) = watcher.due(7, no_shard)
    assert fired.step == 7, "it strikes once the marker can be written"


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('{"kind": "meteor", "rank": 0}', "kind 'meteor'"),
        ('{"kind": "nan", "rank": -1}', "rank must be"),
        ('{"kind": "nan", "rank": 0, "steps": 0}', "steps must be"),
        ("[1, 2]", "expected an object"),
        ("{kind", "not JSON"),
    ],
)
def test_a_bad_trigger_is_ignored_with_the_reason(tmp_path: Path, body: str, problem: str) -> None:
    (tmp_path / "0006-bad.json").write_text(body)
    watcher = box(tmp_path, 0)
    assert watcher.due(1, no_shard) == []
    assert watcher.due(2, no_shard) == []
    (warning,) = watcher.warnings
    assert problem in warning, warning
    assert "0006-bad" in warning


def test_a_missing_directory_is_no_fault_yet(tmp_path: Path) -> None:
    watcher = box(tmp_path / "not-yet", 0)
    assert watcher.due(1, no_shard) == []
    write_trigger(tmp_path / "not-yet", "0007-hang", {"kind": "hang", "rank": 0})
    (fired,) = watcher.due(2, no_shard)
    assert fired.kind == "hang"


SHARDS = [f"shard-{i:04d}" for i in range(6)]


@pytest.mark.parametrize(
    ("position", "passed_over", "expected"),
    [
        (0, set(), "shard-0000"),  # nothing read yet: the first shard is whole
        (1, set(), "shard-0001"),  # shard 0 started: the next one
        (256, set(), "shard-0001"),  # exactly at a boundary: that shard, unread
        (300, {"shard-0002"}, "shard-0003"),  # the skip-list's shard is never read
        (300, {"shard-0002", "shard-0003"}, "shard-0004"),
        (5 * 256 + 7, set(), "shard-0000"),  # the last shard started: the next epoch's first
        (6 * 256 + 3, set(), "shard-0001"),  # positions count epochs
    ],
)
def test_the_shard_read_next(position: int, passed_over: set[str], expected: str) -> None:
    assert triggers.shard_read_next(position, SHARDS, 256, passed_over) == expected


def test_no_shard_left_to_poison_is_an_error() -> None:
    with pytest.raises(ValueError, match="none is left"):
        triggers.shard_read_next(10, SHARDS, 256, set(SHARDS))
