"""The status the supervisor serves while no training agent answers says it sends nothing
to the PFS: its training process, which replicates, is gone, so a stop never waits for the
local copies its scan lists incomplete on the PFS."""

from __future__ import annotations

from pathlib import Path

from ckpt_copies import KEY, write_copy

from stabletrain_agent.checkpoint.layout import local_part_root
from stabletrain_agent.supervisor.own_status import TierScan, own_status
from stabletrain_contract import env
from stabletrain_contract.channel import AgentStatus


def test_a_scan_without_the_training_process_shows_nothing_on_its_way(tmp_path: Path) -> None:
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    pfs.mkdir()
    write_copy(local_part_root(local, "0"), 20, attempt=0, node="0", nodes=("0",))
    environ = {
        env.LOCAL_CHECKPOINT_DIR: str(local),
        env.PFS_CHECKPOINT_DIR: str(pfs),
        env.NODE_NAME: "node-a",
        env.NODE_RANK: "0",
        env.CHECKPOINT_KEY: KEY.secret.decode() if KEY.secret else "",
    }
    status = AgentStatus.model_validate(own_status(environ, 0, None, TierScan(environ)))
    assert [(r.step, r.pfs.complete, bool(r.local)) for r in status.inventory] == [
        (20, False, True)
    ]
    assert (status.pfs_available, status.replicating) == (True, ())
    empty = {**environ, env.LOCAL_CHECKPOINT_DIR: str(tmp_path / "none")}
    nothing = AgentStatus.model_validate(own_status(empty, 0, None, TierScan(empty)))
    assert (nothing.pfs_available, nothing.replicating) == (None, None), "no evidence"
