"""Turning a finished save (files under a temporary name) into a checkpoint copy.

Order matters: the data files are already fsynced by their writer; the manifest with
their checksums (and, with the job's key, their SHA-256 and its signature) is written and
fsynced next; one rename then makes the copy visible and the parent directory is fsynced
so the rename itself survives a crash.  Anything that dies earlier leaves only a dot-named
directory, which scanners ignore.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from stabletrain_agent.checkpoint.atomic import fsync_dir
from stabletrain_agent.checkpoint.fence import check_not_stale
from stabletrain_agent.checkpoint.layout import MANIFEST_NAME, local_copy_dir
from stabletrain_agent.checkpoint.manifest import CopyManifest, describe_files, encode_manifest
from stabletrain_agent.checkpoint.signing import CheckpointKey


def commit_copy(
    temp: Path,
    local_root: Path,
    *,
    key: CheckpointKey,
    step: int,
    attempt: int,
    node: str,
    nodes: Sequence[str],
    ranks: Sequence[int],
    world_size: int,
    stable: bool,
    spike_marker: bool = False,
    anomalies: Sequence[str] = (),
    episode: int | None = None,
    baseline: Mapping[str, float] | None = None,
) -> CopyManifest:
    """Write the manifest last (signed with `key` when the job has one) and rename `temp`
    into the copy's final place."""
    check_not_stale(local_root, attempt)
    manifest = CopyManifest(
        step=step,
        attempt=attempt,
        node=node,
        nodes=tuple(nodes),
        ranks=tuple(ranks),
        world_size=world_size,
        files=describe_files(temp, sha256=key.signs),
        stable=stable,
        spike_marker=spike_marker,
        anomalies=tuple(anomalies),
        episode=episode,
        baseline=dict(baseline or {}),
    )
    if key.signs:
        manifest = manifest.signed_with(key)
    manifest.check_names()
    with (temp / MANIFEST_NAME).open("xb") as handle:
        handle.write(encode_manifest(manifest))
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(temp)
    final = local_copy_dir(local_root, step, attempt)
    os.rename(temp, final)
    fsync_dir(final.parent)
    return manifest
