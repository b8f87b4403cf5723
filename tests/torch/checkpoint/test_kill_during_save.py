"""SIGKILL a saving process at random moments; whatever the inventory calls complete must be
exactly the reference state of its step, and a restore must always succeed."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ckpt_reference import empty_app, empty_cursor, matches, reference, reference_cursor
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict_loader import load

from stabletrain_agent.checkpoint.inventory_scan import (
    VerifyCache,
    build_records,
    combined_fence,
    scan_local,
    scan_pfs,
)
from stabletrain_agent.checkpoint.layout import local_copy_dir, local_part_root, pfs_part_dir
from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.checkpoint.signing import UNSIGNED
from support.processes import DIE_WITH_PARENT

MID_SAVE_KILLS = 50
MAX_KILLS = 200
HERE = Path(__file__).parent


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    (tmp_path / "pfs").mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen(
        [
            *DIE_WITH_PARENT,
            sys.executable,
            "-W",
            "ignore",
            str(HERE / "saver_zygote.py"),
            str(tmp_path / "local"),
            str(tmp_path / "pfs"),
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def ask(process: subprocess.Popen[str], command: str) -> int:
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.write(command + "\n")
    process.stdin.flush()
    return int(process.stdout.readline())


def load_copy(directory: Path) -> tuple[object, object]:
    app, cursor = empty_app(), empty_cursor()
    load(
        {"app": app, "node0.local0:cursor": cursor},
        storage_reader=FileSystemReader(directory),
        no_dist=True,
    )
    return app, cursor


def fingerprint(directory: Path) -> tuple[object, ...]:
    return tuple(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(directory.iterdir())
    )


def check_listed_copies(local: Path, pfs: Path, loaded: set[tuple[object, ...]]) -> int:
    """Load every copy a fresh inventory lists as complete, with plain DCP, and compare.

    A copy already loaded and unchanged on disk since (same files, sizes, mtimes) is not
    loaded again; the listing itself is always recomputed from scratch.
    """
    cache = VerifyCache(UNSIGNED)  # the zygote saves without a key
    local = local_part_root(local, "0")
    records = build_records(
        "n0", scan_local(local, "0", cache), scan_pfs(pfs, cache), combined_fence([local, pfs])
    )
    checked = 0
    for record in records:
        directories = []
        if record.local_copy("n0") is not None:
            directories.append(local_copy_dir(local, record.step, record.attempt))
        if record.pfs.verified:
            directories.append(pfs_part_dir(pfs, record.step, record.attempt, "0"))
        for directory in directories:
            key = (directory, fingerprint(directory))
            if key in loaded:
                continue
            app, cursor = load_copy(directory)
            assert matches(app, reference(record.step)), directory  # type: ignore[arg-type]
            assert matches(cursor, reference_cursor(record.step)), directory  # type: ignore[arg-type]
            loaded.add(key)
            checked += 1
    return checked


def test_sigkill_at_random_moments_never_yields_a_bad_complete_checkpoint(
    tmp_path: Path, zygote: subprocess.Popen[str]
) -> None:
    rng = random.Random(6)
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    restored_steps: list[int] = []
    copies_checked = kills = kills_mid_save = 0
    loaded: set[tuple[object, ...]] = set()
    seen_pfs_temps: set[Path] = set()
    kills_in_local_save = 0
    while kills_mid_save < MID_SAVE_KILLS:
        assert kills < MAX_KILLS, f"only {kills_mid_save} of {kills} kills hit a save"
        kills += 1
        attempt = kills
        pid = ask(zygote, f"run {attempt}")
        restored = tmp_path / f"restored-{attempt}.json"
        if rng.random() < 0.9:  # most rounds let the restore finish, some kill it midway
            deadline = time.monotonic() + 30
            while not restored.exists() and time.monotonic() < deadline:
                time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(pid, signal.SIGKILL)
        status = ask(zygote, f"reap {pid}")
        assert os.WIFSIGNALED(status), f"attempt {attempt} exited ({status}): restore failed?"
        # Evidence of what the kill interrupted, counting only this attempt's work: its
        # DCP write (the temp name carries the attempt) or a PFS copy not seen before.
        in_local_save = any(local.glob(f"step-*/.tmp-attempt-{attempt}"))
        pfs_temps = set(pfs.glob("step-*/attempt-*/.tmp-*"))
        in_pfs_copy = bool(pfs_temps - seen_pfs_temps)
        seen_pfs_temps |= pfs_temps
        kills_in_local_save += in_local_save
        kills_mid_save += in_local_save or in_pfs_copy
        if restored.exists():
            restored_steps.append(json.loads(restored.read_text())["step"])
        copies_checked += check_listed_copies(local, pfs, loaded)
    print(
        f"\n{kills} SIGKILLs, {kills_mid_save} of them inside a save: {kills_in_local_save} inside "
        f"the local write, the others inside the PFS copy; {len(restored_steps)} restores "
        f"completed, every one matching its reference; restored steps "
        f"{restored_steps[:4]}...{restored_steps[-3:]}; "
        f"complete copies loaded independently and compared: {copies_checked}"
    )
    assert restored_steps == sorted(restored_steps)  # progress is never lost
    assert restored_steps[-1] > 0
    # Retention held: latest 2 + up to 2 awaiting the PFS + the restored target + the newest
    # stable + at most 3 spike markers locally; on the PFS no copies await anything.
    local_copies = sorted(str(p.relative_to(local)) for p in local.glob("step-*/attempt-*"))
    assert len(local_copies) <= 9, local_copies
    assert len(list(pfs.glob("step-*/attempt-*/node-n0"))) <= 7

    app, cursor = empty_app(), empty_cursor()
    config = CheckpointConfig(local, pfs, kills + 1, "n0")
    manager = CheckpointManager(config, {"app": app}, {"cursor": cursor})
    try:
        result = manager.restore()
    finally:
        manager.close()
    assert result is not None
    assert matches(app, reference(result.step))
    assert matches(cursor, reference_cursor(result.step))
