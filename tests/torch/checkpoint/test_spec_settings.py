"""spec.checkpoints reaches the manager through the pod's env and is obeyed by default:
the save interval, each tier's retention, the spike markers, the local size limit and the
memory tier's interval.

The env is the one the operator's pod builder writes, so a setting lost on either side of
the contract (the operator not passing it, the agent not reading it) fails here.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from ckpt_reference import Holder, reference

from stabletrain_agent.checkpoint import replicate
from stabletrain_agent.checkpoint.layout import iter_attempt_dirs
from stabletrain_agent.checkpoint.manager import CheckpointConfig, CheckpointManager
from stabletrain_agent.checkpoint.manifest import read_manifest
from stabletrain_contract import env
from stabletrain_operator import pods
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.plan.sent_directives import attempt_directives


def pod_environ(checkpoints: dict[str, Any], tmp_path: Path) -> dict[str, str]:
    """The agent's env of pod 0, as the operator builds it, with the tiers under tmp_path."""
    spec = StableTrainingJobSpec.model_validate(
        {
            "workers": {"template": {"spec": {"containers": [{"name": "t", "image": "x"}]}}},
            "checkpoints": {
                "local": {"hostPath": "/nvme"},
                "pfs": {"claimName": "pfs"},
                **checkpoints,
            },
        }
    )
    pod = pods.build_pod(spec, pods.JobRef("gpt", "team", "uid"), attempt=0, rank=0)
    environ = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
    (tmp_path / "pfs").mkdir()
    environ[env.LOCAL_CHECKPOINT_DIR] = str(tmp_path / "local")
    environ[env.PFS_CHECKPOINT_DIR] = str(tmp_path / "pfs")
    environ[env.NODE_NAME] = "n0"
    if env.MEMORY_CHECKPOINT_DIR in environ:
        environ[env.MEMORY_CHECKPOINT_DIR] = str(tmp_path / "memory")
    return environ


def steps_on(root: Path) -> list[int]:
    return [step for step, _, _ in iter_attempt_dirs(root)]


def run(manager: CheckpointManager, holder: Holder, steps: range, **save: Any) -> list[int]:
    """Save at every step the manager calls a save step; the steps whose save started.

    Each save is on the PFS before the next step, as in a run whose steps take longer than
    a copy: here they take no time, and a replication that fell behind the saves would
    give up copies (test_a_copy_being_replicated_is_kept_until_it_lands).
    """
    started = []
    for step in steps:
        holder.state = reference(step)
        if manager.is_save_step(step) and manager.save(step, **save):
            started.append(step)
            manager.wait()
            assert not manager.flush(30).timed_out
    return started


def test_interval_and_retention_come_from_the_spec(tmp_path: Path) -> None:
    settings = {"intervalSteps": 3, "spikeMarkers": 1}
    environ = pod_environ(
        {**settings, "local": {"hostPath": "/n", "retention": 2}, "pfs": {"claimName": "p"}},
        tmp_path,
    )
    config = CheckpointConfig.from_env(environ)
    assert (config.interval_steps, config.keep_local, config.keep_pfs) == (3, 2, 3)
    assert (config.max_spike_markers, config.local_size_limit_bytes) == (1, None)
    holder = Holder(reference(0))
    manager = CheckpointManager(config, {"app": holder})
    try:
        assert manager.restore() is None
        assert run(manager, holder, range(1, 21), stable=True) == [3, 6, 9, 12, 15, 18]
    finally:
        manager.close()
    assert steps_on(config.local_dir) == [15, 18]
    # Trimmed when a copy lands, not only at the next save: the flush returned after it.
    assert steps_on(config.pfs_root) == [12, 15, 18]


def test_a_copy_being_replicated_is_kept_until_it_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saves faster than the PFS: the local retention (2) would delete the copy the
    replicator is writing.  Before, it did, and a replication slower than two saves never
    landed a copy while the job ran."""
    copying, go_on = threading.Event(), threading.Event()
    real_copy = replicate.replicate_copy

    def slow_pfs(local: Path, pfs: Path, step: int, *args: Any, **kwargs: Any) -> int:
        if step == 1:
            copying.set()
            assert go_on.wait(30)
        return real_copy(local, pfs, step, *args, **kwargs)

    monkeypatch.setattr(replicate, "replicate_copy", slow_pfs)
    checkpoints = {"intervalSteps": 1, "local": {"hostPath": "/n", "retention": 2}}
    config = CheckpointConfig.from_env(pod_environ(checkpoints, tmp_path))
    holder = Holder(reference(0))
    manager = CheckpointManager(config, {"app": holder})
    try:
        assert manager.restore() is None
        holder.state = reference(1)
        assert manager.save(1, stable=True)
        assert copying.wait(30), "the replicator never started on step 1"
        for step in (2, 3, 4):
            holder.state = reference(step)
            assert manager.save(step, stable=True)
            manager.wait()
        assert steps_on(config.local_dir) == [1, 3, 4], "2 gave way, 1 is on its way"
        go_on.set()
        assert not manager.flush(30).timed_out
    finally:
        go_on.set()
        manager.close()
    assert steps_on(config.pfs_root) == [1, 3, 4]


def test_spike_markers_keep_the_earliest_of_the_newest_episode(tmp_path: Path) -> None:
    config = CheckpointConfig.from_env(
        pod_environ({"intervalSteps": 2, "spikeMarkers": 1}, tmp_path)
    )
    holder = Holder(reference(0))
    manager = CheckpointManager(config, {"app": holder})
    try:
        assert manager.restore() is None
        assert run(manager, holder, range(1, 5), stable=True) == [2, 4]
        first = run(manager, holder, range(5, 11), stable=False, spike_marker=True)
        assert first == [6], "only the first marker of the episode is written"
        assert run(manager, holder, range(11, 13), stable=True) == [12]
        second = run(manager, holder, range(13, 17), stable=False, spike_marker=True)
        assert second == [14]
    finally:
        manager.close()
    local = {step: read_manifest(path) for step, _, path in iter_attempt_dirs(config.local_dir)}
    assert [s for s, m in local.items() if m.spike_marker] == [14]
    assert local[14].episode == 14
    assert [s for s, m in local.items() if not m.spike_marker] == [2, 4, 12]


def test_the_size_limit_keeps_fewer_local_copies_than_the_retention(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    probe.mkdir()
    copy_bytes = measure_copy_bytes(probe)
    limit = int(4.5 * copy_bytes)  # 4 copies fit: 3 kept next to the one being written
    checkpoints = {"intervalSteps": 1, "local": {"hostPath": "/n", "retention": 6,
                                                  "sizeLimit": limit}}  # fmt: skip
    config = CheckpointConfig.from_env(pod_environ(checkpoints, tmp_path))
    assert config.local_size_limit_bytes == limit
    holder = Holder(reference(0))
    manager = CheckpointManager(config, {"app": holder})
    try:
        assert manager.restore() is None
        assert run(manager, holder, range(1, 9), stable=True) == list(range(1, 9))
    finally:
        manager.close()
    assert steps_on(config.local_dir) == [6, 7, 8]
    used = sum(f.stat().st_size for f in config.local_root.rglob("*") if f.is_file())
    assert used <= limit, (used, limit)
    assert steps_on(config.pfs_root) == [6, 7, 8]


def test_the_memory_interval_comes_from_the_spec(tmp_path: Path) -> None:
    """Snapshots at every multiple of memory.intervalSteps that is not a save step; only the
    newest stays in the memory tier. An interval of 0 mounts no tier and takes none."""
    environ = pod_environ({"intervalSteps": 5, "memory": {"intervalSteps": 2}}, tmp_path)
    config = CheckpointConfig.from_env(environ)
    assert config.memory_interval_steps == 2
    assert config.memory_dir == tmp_path / "memory" / "node-0"
    holder = Holder(reference(0))
    manager = CheckpointManager(config, {"app": holder})
    snapshots = []
    try:
        assert manager.restore() is None
        for step in range(1, 12):
            holder.state = reference(step)
            if manager.snapshot(step, stable=True):
                snapshots.append(step)
                assert manager.memory is not None
                manager.memory.wait()
                assert steps_on(config.memory_dir) == [step]
    finally:
        manager.close()
    assert snapshots == [2, 4, 6, 8]  # 10 is a save step: the local copy holds it

    off = tmp_path / "off"
    off.mkdir()
    config = CheckpointConfig.from_env(pod_environ({"memory": {"intervalSteps": 0}}, off))
    assert config.memory_dir is None
    manager = CheckpointManager(config, {"app": holder})
    try:
        assert manager.restore() is None
        assert not any(manager.snapshot(step, stable=True) for step in range(1, 30))
    finally:
        manager.close()


def measure_copy_bytes(root: Path) -> int:
    """What one copy of the reference state takes on disk, as the manager writes it."""
    (root / "pfs").mkdir()
    holder = Holder(reference(1))
    manager = CheckpointManager(
        CheckpointConfig(root / "local", root / "pfs", 0, "n0"), {"a": holder}
    )
    try:
        manager.restore()
        manager.save(1, stable=True)
        manager.wait()
    finally:
        manager.close()
    ((_, _, path),) = iter_attempt_dirs(manager.config.local_dir)
    return sum(f.stat().st_size for f in path.iterdir())


def test_an_edited_spec_s_settings_change_the_running_manager(tmp_path: Path) -> None:
    """Started with the env of interval 3 and retention 2 (local) / 3 (PFS); the edited spec
    (interval 5, retention 3 / 2) arrives in the live directives the operator builds from it:
    the next saves are at multiples of 5 and each tier keeps its new count."""
    environ = pod_environ(
        {"intervalSteps": 3, "local": {"hostPath": "/n", "retention": 2},
         "pfs": {"claimName": "p", "retention": 3}},
        tmp_path,
    )  # fmt: skip
    config = CheckpointConfig.from_env(environ)
    holder = Holder(reference(0))
    manager = CheckpointManager(config, {"app": holder})
    edited = StableTrainingJobSpec.model_validate(
        {
            "workers": {"template": {"spec": {"containers": [{"name": "t", "image": "x"}]}}},
            "checkpoints": {"local": {"hostPath": "/n", "retention": 3},
                            "pfs": {"claimName": "p", "retention": 2}, "intervalSteps": 5},
        }
    )  # fmt: skip
    live = attempt_directives(edited, generation=2, attempt=0, resume_step=None, lr_scale=1.0,
                              rewarmup_steps=0, skip=())  # fmt: skip
    assert live.checkpoints is not None
    try:
        assert manager.restore() is None
        assert run(manager, holder, range(1, 10), stable=True) == [3, 6, 9]
        manager.apply_settings(live.checkpoints)
        assert run(manager, holder, range(10, 26), stable=True) == [10, 15, 20, 25]
    finally:
        manager.close()
    assert steps_on(config.local_dir) == [15, 20, 25]
    assert steps_on(config.pfs_root) == [20, 25]
