"""The skip-aware data helper: ranks disjoint, skipped data never read, exact resume."""

from __future__ import annotations

import itertools

import pytest

from stabletrain_agent.data import (
    BatchSkip,
    SampleRange,
    Shard,
    ShardedBatches,
    SkipList,
    skip_list_from_directives,
)
from stabletrain_contract.directives import RUN_END, SkipRange, SkipUnit

Sample = tuple[str, int]

SHARDS = [Shard("a", 10), Shard("b", 7), Shard("c", 12), Shard("d", 5)]


class RecordingShards:
    """Test-side storage that logs every sample it hands out, independent of the helper."""

    def __init__(self) -> None:
        self.fetched: list[Sample] = []

    def read(self, shard_id: str, start: int, stop: int) -> list[Sample]:
        samples = [(shard_id, i) for i in range(start, stop)]
        self.fetched.extend(samples)
        return samples


def flatten(chunks: list[list[Sample]]) -> list[Sample]:
    return [sample for chunk in chunks for sample in chunk]


def make(
    storage: RecordingShards,
    *,
    rank: int = 0,
    world_size: int = 1,
    skip: SkipList | None = None,
    batch_size: int = 3,
) -> ShardedBatches[list[Sample], list[Sample]]:
    return ShardedBatches(
        SHARDS,
        storage.read,
        flatten,
        batch_size=batch_size,
        rank=rank,
        world_size=world_size,
        skip=skip,
    )


def take(batches: ShardedBatches[list[Sample], list[Sample]], n: int) -> list[list[Sample]]:
    return list(itertools.islice(batches, n))


def every_sample_in_order() -> list[Sample]:
    return [(s.shard_id, i) for s in SHARDS for i in range(s.num_samples)]


def test_ranks_read_disjoint_slices_that_tile_the_stream_across_epochs() -> None:
    storage = RecordingShards()
    rank0 = take(make(storage, rank=0, world_size=2), 12)
    rank1 = take(make(storage, rank=1, world_size=2), 12)
    tiled = [sample for pair in zip(rank0, rank1, strict=True) for b in pair for sample in b]
    per_epoch = every_sample_in_order()
    assert tiled == (per_epoch * 3)[: 12 * 6]


def test_skipped_batches_and_shards_are_never_read() -> None:
    reference_storage = RecordingShards()
    reference = take(make(reference_storage), 6)
    storage = RecordingShards()
    skip = SkipList(batches=(BatchSkip(2, 4),))
    batches = make(storage, skip=skip)
    got = take(batches, 4)
    assert got == [reference[0], reference[1], reference[4], reference[5]]
    never_read = {sample for b in reference[2:4] for sample in b}
    assert never_read.isdisjoint(storage.fetched)
    assert never_read.isdisjoint(
        (r.shard_id, i) for r in batches.read_log for i in range(r.start, r.stop)
    )

    shard_storage = RecordingShards()
    by_shard = make(shard_storage, skip=SkipList(shard_ids=frozenset({"b", "d"})))
    read = [sample for b in take(by_shard, 20) for sample in b]
    assert {shard for shard, _ in shard_storage.fetched} == {"a", "c"}
    assert {r.shard_id for r in by_shard.read_log} == {"a", "c"}
    expected = [s for s in every_sample_in_order() if s[0] in {"a", "c"}] * 3
    assert read == expected[:60]


def test_lineage_names_the_ranges_of_the_batch_just_returned() -> None:
    batches = make(RecordingShards(), rank=1, world_size=2, skip=SkipList((BatchSkip(0, 1),)))
    batch = next(batches)
    lineage = batches.last_lineage
    assert lineage is not None
    assert lineage.batch_index == 1
    assert lineage.ranges == (SampleRange("a", 9, 10), SampleRange("b", 0, 2))
    assert batch == [("a", 9), ("b", 0), ("b", 1)]


def test_resume_continues_exactly_at_the_cursor() -> None:
    skip = SkipList(batches=(BatchSkip(5, 7),), shard_ids=frozenset({"c"}))
    original = make(RecordingShards(), rank=1, world_size=2, skip=skip)
    take(original, 4)
    cursor = original.state_dict()
    continuation = take(original, 9)

    storage = RecordingShards()
    resumed = make(storage, rank=1, world_size=2, skip=skip)
    resumed.load_state_dict(cursor)
    assert take(resumed, 9) == continuation
    assert all(shard != "c" for shard, _ in storage.fetched)


def test_a_grown_skip_list_keeps_the_cursor_pointing_at_the_same_place() -> None:
    original = make(RecordingShards())
    take(original, 2)
    cursor = original.state_dict()
    expected_next = [s for s in every_sample_in_order()[6:] if s[0] != "b"][:3]

    resumed = make(RecordingShards(), skip=SkipList(shard_ids=frozenset({"b"})))
    resumed.load_state_dict(cursor)
    assert next(resumed) == expected_next


@pytest.mark.parametrize(
    ("skip", "message"),
    [
        (SkipList(shard_ids=frozenset({"zz"})), "does not have: \\['zz'\\]"),
        (SkipList(shard_ids=frozenset({"a", "b", "c", "d"})), "names every shard"),
    ],
)
def test_an_unusable_skip_list_is_rejected_by_name(skip: SkipList, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(RecordingShards(), skip=skip)


def test_bad_ranges_shards_and_cursors_are_rejected() -> None:
    with pytest.raises(ValueError, match="empty or negative"):
        BatchSkip(4, 4)
    with pytest.raises(ValueError, match="appears twice"):
        ShardedBatches(
            [Shard("a", 1), Shard("a", 2)], RecordingShards().read, flatten, batch_size=1
        )
    with pytest.raises(ValueError, match="'e' has 0 samples"):
        ShardedBatches([Shard("e", 0)], RecordingShards().read, flatten, batch_size=1)
    with pytest.raises(ValueError, match="rank 2 is outside world size 2"):
        make(RecordingShards(), rank=2, world_size=2)
    with pytest.raises(ValueError, match="cannot be negative"):
        make(RecordingShards()).load_state_dict({"position": -1, "batch_index": 0})


def test_a_range_limited_to_some_shards_skips_their_samples_there_and_in_every_later_pass() -> None:
    """The window of batches 4-5 meets shard b at its third sample: b's first two samples
    were read before it and stay in the data; the five it passed over never come back,
    not in a later epoch (other batch indices) and not after a resume from the cursor."""
    storage = RecordingShards()
    batches = make(storage, skip=SkipList(batches=(BatchSkip(4, 6, frozenset({"b"})),)))
    got = take(batches, 20)
    reference = take(make(RecordingShards()), 4)
    assert got[:4] == reference[:4]
    assert reference[3] == [("a", 9), ("b", 0), ("b", 1)]
    assert all(shard != "b" for b in got[4:6] for shard, _ in b)
    later = [sample for b in got[6:] for sample in b]
    assert len(later) > 34, "more than a whole epoch after the window"
    assert {i for shard, i in later if shard == "b"} == {0, 1}
    assert {(shard, i) for shard, i in later if shard != "b"} >= {
        (s.shard_id, i) for s in SHARDS if s.shard_id != "b" for i in range(s.num_samples)
    }
    resumed_storage = RecordingShards()
    resumed = make(resumed_storage)
    resumed.load_state_dict(batches.state_dict())
    take(resumed, 30)
    assert {i for shard, i in resumed_storage.fetched if shard == "b"} == {0, 1}


def test_samples_skipped_for_good_that_leave_nothing_to_read_are_an_error() -> None:
    batches = make(RecordingShards())
    state = batches.state_dict()
    state["skipped_samples"] = [[s.shard_id, 0, s.num_samples] for s in SHARDS]
    batches.load_state_dict(state)
    with pytest.raises(ValueError, match="leave nothing to train on"):
        next(batches)
    with pytest.raises(ValueError, match=r"\[shard id, start, stop\].*\['b', 3, 3\]"):
        batches.load_state_dict({**state, "skipped_samples": [["b", 3, 3]]})


def test_step_ranges_of_the_directives_become_the_batches_those_steps_consumed() -> None:
    ranges = (
        SkipRange(first=2, last=3, unit=SkipUnit.BATCH),
        SkipRange(first=8, last=9, unit=SkipUnit.STEP),
        SkipRange(first=1, last=4, unit=SkipUnit.STEP),
        SkipRange(first=12, last=12, unit=SkipUnit.STEP, shard_ids=("c",)),
    )
    skip = skip_list_from_directives(ranges, resume_step=5, next_batch_index=4)
    # Steps 6.. consumed batches 4, 5, 6, 7 (steps 6-9), 8, 9, 10 (steps 10-12).
    assert skip.batches == (
        BatchSkip(2, 4),
        BatchSkip(6, 8),
        BatchSkip(10, 11, frozenset({"c"})),
    )
    tripped_run = make(RecordingShards(), skip=SkipList(batches=(BatchSkip(2, 4),)))
    tripped_run.load_state_dict({"position": 12, "batch_index": 4})
    consumed = {}
    for step in range(6, 13):
        next(tripped_run)
        assert tripped_run.last_lineage is not None
        consumed[step] = tripped_run.last_lineage.batch_index
    assert (consumed[8], consumed[9], consumed[12]) == (6, 7, 10)


def test_a_range_to_the_run_end_keeps_its_shards_out_of_every_later_pass() -> None:
    """The operator's answer to a shard suspected twice: unit Batch, 0 to RUN_END."""
    for_good = SkipRange(first=0, last=RUN_END, unit=SkipUnit.BATCH, shard_ids=("b",))
    around = SkipRange(first=6, last=7, unit=SkipUnit.STEP, shard_ids=("c",))
    skip = skip_list_from_directives((for_good, around), resume_step=5, next_batch_index=5)
    storage = RecordingShards()
    batches = make(storage, skip=skip)
    batches.load_state_dict({"position": 15, "batch_index": 5})
    read = [sample for b in take(batches, 40) for sample in b]
    assert len(read) == 120, "over eight passes over the 15 samples of a and d"
    assert "b" not in {shard for shard, _ in storage.fetched}
    # Steps 6-7 met c at its first sample, so the range passed over all of it: out for good.
    assert {shard for shard, _ in storage.fetched} == {"a", "d"}
