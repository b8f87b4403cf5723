"""The per-copy manifest: written last, it is what turns a directory of files into a checkpoint.

One manifest describes one node's copy (its local copy, or its part on the PFS): the step,
the attempt of the writer, every file with its size and CRC-32, and the guard's verdict.

Why CRC-32 and not sha256: the threat is accidental damage (torn writes, truncation, bit
flips in storage or transfer), not an adversary who forges files.  CRC-32 detects every
1- and 2-bit error and every burst up to 32 bits, and misses random damage with
probability 2^-32, the same class of check ZFS (fletcher4) and HDFS (CRC32C) rely on.
zlib's CRC-32 runs at several GB/s here against sha256's ~1.8 GB/s with SHA extensions (less
on a loaded machine); with sha256 every verified PFS copy cost copy time plus hash time,
about 40% of `cp` + fsync throughput in bench/checkpoint_io.py, far from the 80% target.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stabletrain_agent.checkpoint.atomic import crc32_file
from stabletrain_agent.checkpoint.layout import MANIFEST_NAME, TEMP_PREFIX, check_node_name
from stabletrain_agent.contract.base import error_lines


class CheckpointCorruptError(Exception):
    """A copy that does not verify; the message names the copy and the problem."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"checkpoint copy {path} does not verify: {problem}")
        self.path = path
        self.problem = problem


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(ge=0)
    crc32: str = Field(pattern=r"^[0-9a-f]{8}$")


class CopyManifest(BaseModel):
    """What one node wrote for one step, and what the guard thought of that step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = 1
    step: int = Field(ge=0)
    attempt: int = Field(ge=0)
    node: str
    nodes: tuple[str, ...] = Field(min_length=1, description="every node of the run at save")
    ranks: tuple[int, ...] = Field(min_length=1, description="global ranks on this node")
    world_size: int = Field(ge=1)
    files: dict[str, FileEntry]
    stable: bool
    spike_marker: bool = False
    anomalies: tuple[str, ...] = ()
    episode: int | None = Field(default=None, ge=0)
    """A spike marker's episode: the step of the first marker saved in that anomaly (its
    retention keeps the earliest of an episode); None for regular checkpoints."""
    baseline: dict[str, float] = Field(default_factory=dict)
    created_at: float = Field(default_factory=time.time)

    def check_names(self) -> None:
        check_node_name(self.node)
        for node in self.nodes:
            check_node_name(node)


def describe_files(directory: Path) -> dict[str, FileEntry]:
    """Sizes and checksums of every data file in a finished (not yet committed) copy."""
    entries: dict[str, FileEntry] = {}
    for path in sorted(directory.iterdir()):
        if path.name == MANIFEST_NAME or path.name.startswith(TEMP_PREFIX):
            continue
        if not path.is_file():
            raise CheckpointCorruptError(directory, f"unexpected non-file entry {path.name!r}")
        entries[path.name] = FileEntry(size=path.stat().st_size, crc32=crc32_file(path))
    if not entries:
        raise CheckpointCorruptError(directory, "no data files to describe")
    return entries


def encode_manifest(manifest: CopyManifest) -> bytes:
    return json.dumps(manifest.model_dump(mode="json"), indent=1, sort_keys=True).encode()


def read_manifest(directory: Path) -> CopyManifest:
    path = directory / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointCorruptError(directory, f"{MANIFEST_NAME} is missing") from None
    try:
        manifest = CopyManifest.model_validate_json(raw)
    except ValidationError as error:
        first = error_lines(error, root="(document)")[0]
        raise CheckpointCorruptError(
            directory, f"{MANIFEST_NAME} is not a valid manifest at {first}"
        ) from None
    manifest.check_names()
    return manifest


def verify_copy(
    directory: Path,
    *,
    step: int,
    attempt: int,
    node: str | None = None,
    deep: bool = True,
) -> CopyManifest:
    """Return the manifest if the copy is exactly what it claims to be, else raise.

    The step and attempt come from the path and must match the manifest, so a manifest
    moved or written into another checkpoint's directory is rejected.  `deep=False` checks
    sizes only (for frequent inventory scans); restore and replication always go deep.
    """
    manifest = read_manifest(directory)
    if manifest.step != step or manifest.attempt != attempt:
        raise CheckpointCorruptError(
            directory,
            f"manifest says step {manifest.step} attempt {manifest.attempt}, "
            f"the path says step {step} attempt {attempt}",
        )
    if node is not None and manifest.node != node:
        raise CheckpointCorruptError(
            directory, f"manifest is node {manifest.node!r}'s, expected node {node!r}"
        )
    for name, entry in sorted(manifest.files.items()):
        path = directory / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointCorruptError(directory, f"file {name!r} is missing") from None
        if size != entry.size:
            raise CheckpointCorruptError(
                directory, f"file {name!r} has {size} bytes, the manifest says {entry.size}"
            )
        if deep and crc32_file(path) != entry.crc32:
            raise CheckpointCorruptError(directory, f"file {name!r} fails its crc32 check")
    return manifest
