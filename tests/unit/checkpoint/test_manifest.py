from __future__ import annotations

import json
from pathlib import Path

import pytest
from ckpt_copies import KEY, write_copy

from stabletrain_agent.checkpoint.layout import MANIFEST_NAME, iter_attempt_dirs
from stabletrain_agent.checkpoint.manifest import CheckpointCorruptError, verify_copy
from stabletrain_agent.checkpoint.signing import UNSIGNED


def test_committed_copy_verifies_and_temp_name_is_gone(tmp_path: Path) -> None:
    copy = write_copy(tmp_path, 100)
    manifest = verify_copy(copy, step=100, attempt=1, node="n0", key=KEY)
    assert sorted(manifest.files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert [(s, a) for s, a, _ in iter_attempt_dirs(tmp_path)] == [(100, 1)]
    assert not any(p.name.startswith(".tmp-") for p in copy.parent.iterdir())


def test_flipped_byte_is_named(tmp_path: Path) -> None:
    copy = write_copy(tmp_path, 100)
    shard = copy / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[1234] ^= 0x01
    shard.write_bytes(bytes(data))
    verify_copy(
        copy, step=100, attempt=1, deep=False, key=KEY
    )  # same size: only the checksum sees it
    with pytest.raises(CheckpointCorruptError, match=r"'__1_0.distcp' fails its crc32"):
        verify_copy(copy, step=100, attempt=1, key=KEY)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda c: (c / "__0_0.distcp").write_bytes(b"torn"),
            "has 4 bytes, the manifest says 4096",
        ),
        (lambda c: (c / "__0_0.distcp").unlink(), "'__0_0.distcp' is missing"),
        (lambda c: (c / MANIFEST_NAME).unlink(), "MANIFEST.json is missing"),
        (lambda c: (c / MANIFEST_NAME).write_text("{"), "not a valid manifest"),
    ],
)
def test_damage_is_rejected_with_the_problem_named(
    tmp_path: Path, damage: object, message: str
) -> None:
    copy = write_copy(tmp_path, 5)
    damage(copy)  # type: ignore[operator]
    with pytest.raises(CheckpointCorruptError, match=message):
        verify_copy(copy, step=5, attempt=1, key=KEY)


def test_manifest_moved_to_another_step_is_rejected(tmp_path: Path) -> None:
    """Unsigned, so that the path check is what refuses it (signed, the edit breaks the
    signature first)."""
    copy = write_copy(tmp_path, 5, key=UNSIGNED)
    raw = json.loads((copy / MANIFEST_NAME).read_text())
    raw["attempt"] = 2
    (copy / MANIFEST_NAME).write_text(json.dumps(raw))
    with pytest.raises(CheckpointCorruptError, match="manifest says step 5 attempt 2"):
        verify_copy(copy, step=5, attempt=1, key=UNSIGNED)
