from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import pytest
from ckpt_copies import KEY, write_copy

from stabletrain_agent.checkpoint import atomic, replicate
from stabletrain_agent.checkpoint.inventory_scan import (
    VerifyCache,
    build_records,
    combined_fence,
    scan_local,
    scan_pfs,
)
from stabletrain_agent.checkpoint.layout import (
    MANIFEST_NAME,
    attempt_dir,
    iter_attempt_dirs,
    pfs_part_dir,
)
from stabletrain_agent.checkpoint.manifest import CheckpointCorruptError, verify_copy
from stabletrain_agent.checkpoint.replicate import (
    PfsUnavailableError,
    Replicator,
    replicate_copy,
)


def test_replicated_part_is_byte_identical_and_verifies(tmp_path: Path) -> None:
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    copy = write_copy(local, 100, size=100_000)
    copied = replicate_copy(local, pfs, 100, 1, "n0", key=KEY)
    part = pfs_part_dir(pfs, 100, 1, "n0")
    assert copied == sum(p.stat().st_size for p in copy.iterdir() if p.name != MANIFEST_NAME)
    subprocess.run(["cmp", copy / "__0_0.distcp", part / "__0_0.distcp"], check=True)
    verify_copy(part, step=100, attempt=1, node="n0", key=KEY)
    assert replicate_copy(local, pfs, 100, 1, "n0", key=KEY) == 0  # idempotent


def test_corrupt_local_copy_is_not_propagated(tmp_path: Path) -> None:
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    copy = write_copy(local, 100)
    shard = copy / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match="fails its crc32 check"):
        replicate_copy(local, pfs, 100, 1, "n0", key=KEY)
    assert not pfs_part_dir(pfs, 100, 1, "n0").exists()
    assert list(pfs.iterdir()) == []  # not even the empty step it was to go under


def test_pfs_is_complete_only_with_every_nodes_part(tmp_path: Path) -> None:
    pfs = tmp_path / "pfs"
    pfs.mkdir()
    nodes = ("n0", "n1")
    for node in nodes:
        write_copy(tmp_path / node, 100, node=node, nodes=nodes)
    cache = VerifyCache(KEY)
    replicate_copy(tmp_path / "n0", pfs, 100, 1, "n0", key=KEY)
    assert not scan_pfs(pfs, cache)[(100, 1)].complete
    replicate_copy(tmp_path / "n1", pfs, 100, 1, "n1", key=KEY)
    assert scan_pfs(pfs, cache)[(100, 1)].complete
    flip = pfs_part_dir(pfs, 100, 1, "n1") / "__1_0.distcp"
    data = bytearray(flip.read_bytes())
    data[0] ^= 1
    flip.write_bytes(bytes(data))
    os.utime(flip, ns=(time.time_ns(), time.time_ns() + 1))
    check = scan_pfs(pfs, cache)[(100, 1)]
    assert not check.complete
    assert "fails its crc32" in (check.parts["n1"].problem or "")


def test_a_copy_given_up_moves_the_change_count(tmp_path: Path) -> None:
    """The agent's status lists what it still sends (`replicating`) and re-exports only
    when the count moved: a copy given up (its local copy gone) must move it too."""
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    replicator = Replicator(local, pfs, "n0", key=KEY)
    try:
        replicator.submit(100, 1)  # no local copy: retention deleted it meanwhile
        assert replicator.flush(10).pending == ()
        assert (replicator.pending(), replicator.changes) == ([], 1)
    finally:
        replicator.close()


def test_pfs_removed_saves_continue_condition_set_then_catch_up(tmp_path: Path) -> None:
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    errors: list[str] = []
    replicator = Replicator(
        local, pfs, "n0", key=KEY, retry_interval_s=0.05, on_error=errors.append
    )
    try:
        write_copy(local, 100)
        replicator.submit(100, 1)
        assert replicator.flush(10).pending == ()
        pfs.rename(tmp_path / "pfs-away")  # the PFS goes away (unmounted)
        for step in (200, 300):
            write_copy(local, step)
            replicator.submit(step, 1)
        result = replicator.flush(0.5)
        assert result.timed_out
        assert result.pending == (200, 300)
        assert not replicator.condition.available
        assert "not there" in replicator.condition.message
        assert not pfs.exists()  # never recreated on the mount point
        (tmp_path / "pfs-away").rename(pfs)
        result = replicator.flush(10)
        assert not result.timed_out
        assert result.replicated == (100, 200, 300)
        assert replicator.condition.available
        for step in (100, 200, 300):
            verify_copy(pfs_part_dir(pfs, step, 1, "n0"), step=step, attempt=1, node="n0", key=KEY)
    finally:
        replicator.close()
    assert any("not there" in message for message in errors)


def test_a_copy_deleted_while_replicating_leaves_no_step_on_the_pfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention removes the local copy the replicator is reading: the copy is dropped and
    the PFS is left as it was, with no empty step for every scan to list and no retention
    to remove (what the size-limit test on a loaded machine used to find)."""
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    write_copy(local, 100, node="n0", nodes=("n0", "n1"))
    write_copy(tmp_path / "n1", 100, node="n1", nodes=("n0", "n1"))
    replicate_copy(tmp_path / "n1", pfs, 100, 1, "n1", key=KEY)  # another node's part
    write_copy(local, 200)
    copy_file = atomic.copy_file_read_back

    def deleted_meanwhile(source: Path, destination: Path) -> tuple[int, str]:
        atomic.remove_tree_durable(source.parent)
        return copy_file(source, destination)

    monkeypatch.setattr(replicate, "copy_file_read_back", deleted_meanwhile)
    with pytest.raises(FileNotFoundError, match="deleted while copying"):
        replicate_copy(local, pfs, 200, 1, "n0", key=KEY)
    with pytest.raises(FileNotFoundError, match="deleted while copying"):
        replicate_copy(local, pfs, 100, 1, "n0", key=KEY)
    assert [step for step, _, _ in iter_attempt_dirs(pfs)] == [100]
    assert [p.name for p in attempt_dir(pfs, 100, 1).iterdir()] == ["node-n1"]


def test_unwritable_pfs_raises_a_named_error(tmp_path: Path) -> None:
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.write_text("a file where the PFS directory should be")
    write_copy(local, 100)
    with pytest.raises(PfsUnavailableError, match="not there"):
        replicate_copy(local, pfs, 100, 1, "n0", key=KEY)


def test_inventory_lists_local_and_pfs_state(tmp_path: Path) -> None:
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    write_copy(local, 100)
    write_copy(local, 200, stable=False, spike_marker=True)
    replicate_copy(local, pfs, 100, 1, "n0", key=KEY)
    cache = VerifyCache(KEY)
    records = build_records(
        "n0", scan_local(local, "n0", cache), scan_pfs(pfs, cache), combined_fence([local, pfs])
    )
    assert [(r.step, r.pfs.verified, r.spike_marker) for r in records] == [
        (100, True, False),
        (200, False, True),
    ]
    assert all(r.local_copy("n0") is not None for r in records)


def test_copy_falls_back_to_a_buffered_copy_where_the_kernel_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(3 * atomic.COPY_CHUNK_BYTES + 123))

    def cross_device(*_: object) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", cross_device)
    size, crc = atomic.copy_file_read_back(source, tmp_path / "copy.bin")
    assert size == source.stat().st_size
    assert (tmp_path / "copy.bin").read_bytes() == source.read_bytes()
    assert crc == atomic.crc32_file(source)
