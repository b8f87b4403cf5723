"""Checkpoints signed with the job's key (issue 29, point 2), with the real manager and real
torch.distributed.checkpoint files: a copy another writer planted, with checksums that match
its files but no signature of the job's key, is refused before a byte of it is unpickled,
moved aside, reported, and the restore falls back as for a damaged copy; even a copy signed
with the key (a leaked key) cannot run code through the metadata or a framework's blob."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import zlib
from pathlib import Path

import pytest
import torch
from ckpt_reference import Holder, empty_app, matches, reference

from stabletrain_agent.checkpoint.layout import (
    MANIFEST_NAME,
    local_copy_dir,
    local_part_root,
    pfs_part_dir,
)
from stabletrain_agent.checkpoint.manager import (
    CheckpointConfig,
    CheckpointManager,
    RestoreTargetMissingError,
)
from stabletrain_agent.checkpoint.manifest import CopyManifest, encode_manifest
from stabletrain_agent.checkpoint.signing import UNSIGNED, CheckpointKey
from stabletrain_agent.integrations.core import BlobState

KEY = CheckpointKey(b"this job's key, from its Secret")
OTHER_JOB = CheckpointKey(b"another job's key")


class Marker:
    """What a hostile pickle does when it is loaded: creates a file (any code could run)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def save_steps(local: Path, pfs: Path, key: CheckpointKey, steps: tuple[int, ...]) -> None:
    holder = Holder(reference(0))
    manager = CheckpointManager(CheckpointConfig(local, pfs, 1, "n0", key=key), {"app": holder})
    try:
        assert manager.restore() is None
        for step in steps:
            holder.state = reference(step)
            manager.save(step, stable=True)
        manager.wait()
        assert not manager.flush(30).timed_out
    finally:
        manager.close()


def copies_of(local: Path, pfs: Path, step: int) -> list[Path]:
    return [local_copy_dir(local_part_root(local, "0"), step, 1), pfs_part_dir(pfs, step, 1, "0")]


def plant(copy: Path, name: str, content: bytes) -> None:
    """Replace one file of a committed copy and fix its manifest's size and checksums, as
    anyone who can write the tier can; the signature it cannot make stays as it was."""
    (copy / name).write_bytes(content)
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    entry = manifest["files"][name]
    entry["size"] = len(content)
    entry["crc32"] = f"{zlib.crc32(content):08x}"
    if entry.get("sha256"):
        entry["sha256"] = hashlib.sha256(content).hexdigest()
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))


def restore(
    local: Path, pfs: Path, key: CheckpointKey, attempt: int = 2, **how: object
) -> tuple[Holder, object, CheckpointManager]:
    holder = empty_app()
    manager = CheckpointManager(
        CheckpointConfig(local, pfs, attempt, "n0", key=key), {"app": holder}
    )
    try:
        return holder, manager.restore(**how), manager  # type: ignore[arg-type]
    finally:
        manager.close()


@pytest.fixture
def tiers(tmp_path: Path) -> tuple[Path, Path]:
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    save_steps(local, pfs, KEY, (10, 20))
    return local, pfs


def test_signed_copies_carry_sha256_and_a_signature_and_restore(
    tiers: tuple[Path, Path],
) -> None:
    local, pfs = tiers
    for copy in copies_of(local, pfs, 20):
        manifest = CopyManifest.model_validate_json((copy / MANIFEST_NAME).read_bytes())
        assert manifest.format == 2
        assert manifest.check_signature(KEY) is None
        assert all(entry.sha256 for entry in manifest.files.values())
    holder, result, manager = restore(local, pfs, KEY)
    assert result is not None
    assert (result.step, result.source) == (20, "local")  # type: ignore[attr-defined]
    assert matches(holder, reference(20))
    assert manager.rejected() == ()


def test_a_planted_copy_with_valid_checksums_is_refused_unread_and_the_restore_falls_back(
    tiers: tuple[Path, Path], tmp_path: Path
) -> None:
    local, pfs = tiers
    marker = tmp_path / "pwned"
    for copy in copies_of(local, pfs, 20):
        plant(copy, ".metadata", pickle.dumps(Marker(marker)))

    planned = CheckpointManager(
        CheckpointConfig(local, pfs, 2, "n0", key=KEY), {"app": empty_app()}
    )
    try:
        with pytest.raises(RestoreTargetMissingError) as missing:
            planned.restore(max_step=20, exact=True)  # what the operator's directives ask
    finally:
        planned.close()
    holder, result, _ = restore(local, pfs, KEY, attempt=3)  # a restart from the newest

    assert not marker.exists(), "the planted pickle ran"
    assert "signature does not match this job's checkpoint key" in str(missing.value)
    assert result is not None
    assert result.step == 10  # type: ignore[attr-defined]
    assert matches(holder, reference(10))
    for copy in copies_of(local, pfs, 20):
        assert not copy.exists(), f"{copy} was not moved aside"
        assert len(list(copy.parent.glob(f".corrupt-{copy.name}-*"))) == 1
    refused = {Path(r.path): r for r in planned.rejected()}
    assert set(refused) == set(copies_of(local, pfs, 20))
    assert all("signature" in r.problem and r.quarantined_as for r in refused.values())


def test_another_jobs_copy_and_an_unsigned_one_are_not_this_jobs(tmp_path: Path) -> None:
    """A copy another job signed with its own key, and one written before signing (or by a
    job without a key), are both refused by a job with a key; a job without one (made
    before signing) reads unsigned copies and refuses signed ones it cannot check."""
    theirs, old = tmp_path / "theirs", tmp_path / "old"
    for tier in (theirs, old):
        (tier / "pfs").mkdir(parents=True)
    save_steps(theirs / "local", theirs / "pfs", OTHER_JOB, (10,))
    save_steps(old / "local", old / "pfs", UNSIGNED, (10,))

    _, from_theirs, mine = restore(theirs / "local", theirs / "pfs", KEY)
    _, from_old, also_mine = restore(old / "local", old / "pfs", KEY)
    _, unsigned_job, _ = restore(old / "local", old / "pfs", UNSIGNED, attempt=3)

    assert from_theirs is None
    assert from_old is None
    assert any("does not match" in r.problem for r in mine.rejected())
    assert any("unsigned" in r.problem for r in also_mine.rejected())
    assert unsigned_job is None, "the copies a keyed job refused were moved aside"
    signed = tmp_path / "signed"
    (signed / "pfs").mkdir(parents=True)
    save_steps(signed / "local", signed / "pfs", KEY, (10,))
    _, signed_for_a_keyless_job, keyless = restore(signed / "local", signed / "pfs", UNSIGNED)
    assert signed_for_a_keyless_job is None
    assert any("no checkpoint key" in r.problem for r in keyless.rejected())


def test_a_leaked_key_still_cannot_run_code_through_the_metadata(
    tiers: tuple[Path, Path], tmp_path: Path
) -> None:
    """The second wall: a copy signed with the job's own key whose metadata is a hostile
    pickle is refused by the metadata's allow-list, not executed."""
    local, pfs = tiers
    marker = tmp_path / "pwned"
    copy = local_copy_dir(local_part_root(local, "0"), 20, 1)
    plant(copy, ".metadata", pickle.dumps(Marker(marker)))
    manifest = CopyManifest.model_validate_json((copy / MANIFEST_NAME).read_bytes())
    (copy / MANIFEST_NAME).write_bytes(encode_manifest(manifest.signed_with(KEY)))
    (pfs_part_dir(pfs, 20, 1, "0") / MANIFEST_NAME).unlink()  # no good copy to fall back to

    holder, result, _ = restore(local, pfs, KEY)

    assert not marker.exists(), "the pickle in a signed copy ran"
    assert result is not None
    assert result.step == 10  # type: ignore[attr-defined]
    assert "not part of checkpoint metadata" in " ".join(result.rejected)  # type: ignore[attr-defined]
    assert matches(holder, reference(10))


def test_a_frameworks_blob_loads_tensors_and_plain_values_only(tmp_path: Path) -> None:
    """A framework's checkpoint travels as one blob (BlobState); it is loaded with
    weights_only=True: what frameworks save loads, an arbitrary class does not."""
    blob = BlobState(lambda: {"state_dict": {"w": torch.ones(3)}, "epoch": 2, "name": "x"})
    blob.load_state_dict(blob.state_dict())
    assert blob.loaded["epoch"] == 2
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"hostile": Marker(marker)}, buffer)
    with pytest.raises(pickle.UnpicklingError):
        blob.load_state_dict({"blob": buffer.getvalue()})
    assert not marker.exists()
