"""Real checkpoint copies on disk for the torch-free tests (plain bytes stand in for DCP files).

Signed with KEY, as a job's pods sign theirs (the key of a job's Secret)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stabletrain_agent.checkpoint.commit import commit_copy
from stabletrain_agent.checkpoint.layout import local_temp_dir
from stabletrain_agent.checkpoint.signing import CheckpointKey

KEY = CheckpointKey(b"the job's checkpoint key, as its Secret holds it")


def write_copy(
    local_root: Path,
    step: int,
    attempt: int = 1,
    node: str = "n0",
    nodes: Sequence[str] = ("n0",),
    *,
    stable: bool = True,
    spike_marker: bool = False,
    size: int = 4096,
    key: CheckpointKey = KEY,
) -> Path:
    temp = local_temp_dir(local_root, step, attempt)
    temp.mkdir(parents=True)
    for index in range(2):
        (temp / f"__{index}_0.distcp").write_bytes(
            bytes((step * 7 + attempt * 3 + index + i) % 251 for i in range(size))
        )
    (temp / ".metadata").write_bytes(f"meta {step} {attempt} {node}".encode())
    commit_copy(
        temp,
        local_root,
        key=key,
        step=step,
        attempt=attempt,
        node=node,
        nodes=nodes,
        ranks=(0,),
        world_size=1,
        stable=stable,
        spike_marker=spike_marker,
    )
    return local_temp_dir(local_root, step, attempt).with_name(f"attempt-{attempt}")
