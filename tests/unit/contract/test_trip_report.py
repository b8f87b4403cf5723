"""The trip report round-trips and always fits the kubelet's 4096-byte termination message."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest

from stabletrain_contract.base import ContractError
from stabletrain_contract.checkpoint.inventory import (
    INVENTORY_MAX,
    CheckpointRecord,
    CopyFlags,
    NodeCopy,
    PodCopy,
    TierCopy,
    compact_inventory,
    expand_entry,
)
from stabletrain_contract.names import AnomalyClass, Signal
from stabletrain_contract.trip_report import (
    EVIDENCE_MAX,
    FIRING_MAX,
    INVENTORY_KEPT_FIRST,
    LINEAGE_PATH_MAX,
    SHARD_ID_MAX,
    SUSPECT_SHARDS_MAX,
    TERMINATION_MESSAGE_LIMIT,
    TripReport,
    parse_termination_message,
    render_termination_message,
)

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def records(count: int, node: str = "node-a") -> list[CheckpointRecord]:
    return [
        CheckpointRecord(
            step=100 * i,
            attempt=i % 4,
            stable=i % 3 != 0,
            spike_marker=i % 7 == 0,
            saved_at=NOW - timedelta(minutes=count - i),
            pfs=TierCopy(complete=True, verified=i % 2 == 0),
            local=(NodeCopy(node=node, complete=True, verified=True),),
        )
        for i in range(count)
    ]


def report(inventory_size: int, **changes: object) -> TripReport:
    fields: dict[str, object] = {
        "attempt": 2,
        "node": "node-a",
        "step": 31_223,
        "tripped_at": NOW,
        "signal": Signal.LOSS_SPIKE,
        "anomaly_class": AnomalyClass.BAD_BATCH,
        "evidence": "loss 5.10 is 2.32x its baseline 2.20 for 4 steps; grad norm normal",
        "value": 5.10,
        "threshold": 3.52,
        "onset_step": 31_219,
        "last_good_step": 31_218,
        "firing": ("LossSpike",),
        # As the agent builds it (signals/trip_report_builder.py): the newest INVENTORY_MAX.
        "inventory": compact_inventory(records(inventory_size), "node-a")[-INVENTORY_MAX:],
        "inventory_omitted": max(0, inventory_size - INVENTORY_MAX),
        "lineage_path": "/pfs/jobs/llm/lineage/attempt-2/spike-31219.jsonl",
    }
    fields.update(changes)
    return TripReport.model_validate(fields)


def test_small_report_round_trips_exactly() -> None:
    original = report(5)
    message = render_termination_message(original)
    assert parse_termination_message(message) == original


def test_long_inventory_is_cut_to_the_newest_entries() -> None:
    """1000 checkpoints: the report holds the newest INVENTORY_MAX (all the operator keeps),
    and with long text beside them the message fits by dropping the oldest of those too."""
    original = long_texts_report()
    assert len(original.inventory) == INVENTORY_MAX
    message = render_termination_message(original)
    size = len(message.encode())
    print(f"1000-entry inventory rendered in {size} bytes")
    assert size <= TERMINATION_MESSAGE_LIMIT
    parsed = parse_termination_message(message)
    kept = len(parsed.inventory)
    assert parsed.inventory_omitted == 1000 - kept
    assert parsed.inventory == original.inventory[-kept:]
    assert INVENTORY_KEPT_FIRST < kept < INVENTORY_MAX
    assert parsed.model_copy(update={"inventory": (), "inventory_omitted": 0}) == (
        original.model_copy(update={"inventory": (), "inventory_omitted": 0})
    )


def long_texts_report() -> TripReport:
    """1000 checkpoints, and a lineage path and evidence so long that not every one of the
    newest INVENTORY_MAX fits beside them."""
    lineage = "/pfs/" + "\U0001f525" * (LINEAGE_PATH_MAX - 5)
    return report(1000, lineage_path=lineage, evidence="\u00e9" * EVIDENCE_MAX)


def test_cut_is_as_small_as_possible() -> None:
    original = long_texts_report()
    parsed = parse_termination_message(render_termination_message(original))
    one_more = parsed.model_copy(
        update={
            "inventory": original.inventory[-(len(parsed.inventory) + 1) :],
            "inventory_omitted": parsed.inventory_omitted - 1,
        }
    )
    assert len(one_more.model_dump_json().encode()) > TERMINATION_MESSAGE_LIMIT


def test_long_suspect_shard_list_is_cut_after_the_old_inventory() -> None:
    shards = tuple(f"s3://corpus/train/shard-{i:06d}.jsonl.zst" for i in range(200))
    lineage = "/pfs/jobs/llm-176b/lineage/attempt-2/window-31169-31223.jsonl"
    original = report(300, suspect_shards=shards, lineage_path=lineage)
    message = render_termination_message(original)
    size = len(message.encode())
    parsed = parse_termination_message(message)
    print(
        f"300 checkpoints + 200 shards -> {size} bytes: kept {len(parsed.inventory)} checkpoints,"
        f" {len(parsed.suspect_shards)} shards"
    )
    assert size <= TERMINATION_MESSAGE_LIMIT
    assert parsed.inventory == original.inventory[-INVENTORY_KEPT_FIRST:]
    assert parsed.inventory_omitted == 300 - INVENTORY_KEPT_FIRST
    kept = len(parsed.suspect_shards)
    assert 0 < kept < 200
    assert parsed.suspect_shards == shards[:kept]
    assert parsed.suspect_shards_omitted == 200 - kept
    assert parsed.lineage_path == lineage


def test_worst_case_fields_still_give_valid_json_within_the_limit() -> None:
    wide = "\U0001f525"  # four bytes in UTF-8
    worst = report(
        1000,
        node="n" * 253,
        evidence=wide * EVIDENCE_MAX,
        lineage_path="/pfs/" + wide * (LINEAGE_PATH_MAX - 5),
        firing=tuple(f"custom:{chr(97 + i)}{'x' * 62}" for i in range(FIRING_MAX)),
        value=math.nan,
        suspect_shards=tuple(wide * SHARD_ID_MAX for _ in range(SUSPECT_SHARDS_MAX)),
    )
    message = render_termination_message(worst)
    assert len(message.encode()) <= TERMINATION_MESSAGE_LIMIT
    parsed = parse_termination_message(message)
    assert math.isnan(parsed.value or 0.0)
    assert parsed.lineage_path == worst.lineage_path
    assert parsed.signal == worst.signal
    assert parsed.onset_step == worst.onset_step
    json.loads(message)


def test_non_finite_value_survives_as_a_string() -> None:
    message = render_termination_message(report(1, signal="NonFinite", value=math.inf))
    assert json.loads(message)["value"] == "Infinity"
    assert parse_termination_message(message).value == math.inf


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ('{"attempt": 1}', "node"),
        (render_termination_message(report(1)).replace("LossSpike", "Spike", 1), "signal"),
        (render_termination_message(report(1)).replace("BadBatch", "Bad"), "anomalyClass"),
        (render_termination_message(report(1))[:-40], "(root)"),
    ],
)
def test_bad_messages_are_contract_errors_naming_the_field(message: str, field: str) -> None:
    with pytest.raises(ContractError) as caught:
        parse_termination_message(message)
    assert f"  {field}:" in str(caught.value)


def test_compact_entry_expands_to_the_node_view() -> None:
    record = records(3)[2]
    entry = compact_inventory([record], "node-a")[0]
    assert entry[2] & CopyFlags.LOCAL_VERIFIED
    assert expand_entry(entry, "node-a", record.saved_at) == record
    elsewhere = compact_inventory([record], "node-b")[0]
    assert not elsewhere[2] & (CopyFlags.LOCAL_COMPLETE | CopyFlags.LOCAL_VERIFIED)


def test_compact_entry_carries_the_writing_pods_memory_copy() -> None:
    record = records(3)[2].model_copy(
        update={"memory": (PodCopy(pod="job-a0-1", complete=True, verified=True),)}
    )
    entry = compact_inventory([record], "node-a", "job-a0-1")[0]
    assert entry[2] & CopyFlags.MEMORY_VERIFIED
    assert expand_entry(entry, "node-a", record.saved_at, "job-a0-1") == record
    other_pod = compact_inventory([record], "node-a", "job-a0-0")[0]
    assert not other_pod[2] & (CopyFlags.MEMORY_COMPLETE | CopyFlags.MEMORY_VERIFIED)
    # A report that names no pod (an older agent) lists no memory copy.
    assert expand_entry(entry, "node-a", record.saved_at).memory == ()
    with_pod = report(1).model_copy(update={"pod": "job-a0-1", "inventory": (entry,)})
    assert parse_termination_message(render_termination_message(with_pod)).pod == "job-a0-1"
