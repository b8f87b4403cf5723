"""The per-copy manifest: written last, it is what turns a directory of files into a checkpoint.

One manifest describes one node's copy (its local copy, or its part on the PFS): the step,
the attempt of the writer, every file with its size and CRC-32, and the guard's verdict.
A job with a checkpoint key (signing.py) writes format 2: each file's SHA-256 too, and an
HMAC of the whole manifest under the key; format 1 is the unsigned form of jobs without one.

Why CRC-32 for the everyday checks and not sha256: the checks the scans and replication run
guard against accidental damage (torn writes, truncation, bit flips in storage or
transfer). CRC-32 detects every 1- and 2-bit error and every burst up to 32 bits, and
misses random damage with probability 2^-32, the same class of check ZFS (fletcher4) and
HDFS (CRC32C) rely on. zlib's CRC-32 runs at several GB/s here against sha256's ~1.8 GB/s
with SHA extensions (less on a loaded machine); with sha256 every verified PFS copy cost
copy time plus hash time, about 40% of `cp` + fsync throughput in bench/checkpoint_io.py,
far from the 80% target. An author is another matter: a CRC is forged in microseconds, so
the signed SHA-256 digests are what a deep check of a signed copy (each copy once, and
every restore) holds the files to; replication still reads back against the CRC.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stabletrain_agent.checkpoint.atomic import digest_file
from stabletrain_agent.checkpoint.layout import MANIFEST_NAME, TEMP_PREFIX, check_node_name
from stabletrain_agent.checkpoint.signing import SIGNATURE_PATTERN, CheckpointKey
from stabletrain_contract import env
from stabletrain_contract.base import error_lines

MANIFEST_MAX_BYTES = 8 * 1024 * 1024
"""A manifest lists a node's files (one per rank and the metadata) and the run's node
ranks: well under this for 10,000 pods. A larger one is refused unread."""
UNSIGNED_FORMAT: Literal[1] = 1
SIGNED_FORMAT: Literal[2] = 2


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
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """Set in a signed manifest (format 2): what a deep check of a signed copy compares."""


class CopyManifest(BaseModel):
    """What one node wrote for one step, and what the guard thought of that step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1, 2] = UNSIGNED_FORMAT
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
    signature: str | None = Field(default=None, pattern=SIGNATURE_PATTERN)
    """HMAC-SHA256 under the job's key of `signed_content()` (format 2); null in format 1."""

    def check_names(self) -> None:
        check_node_name(self.node)
        for node in self.nodes:
            check_node_name(node)

    def signed_content(self) -> bytes:
        """What the signature covers: every field but the signature, in a canonical JSON
        (sorted keys, no spaces), so that a reader re-derives the writer's bytes exactly."""
        fields = self.model_dump(mode="json", exclude={"signature"})
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    def signed_with(self, key: CheckpointKey) -> CopyManifest:
        """This manifest in format 2, signed with `key` (every file must carry its SHA-256)."""
        if any(entry.sha256 is None for entry in self.files.values()):
            raise ValueError("a signed manifest needs the SHA-256 of every file")
        unsigned = self.model_copy(update={"format": SIGNED_FORMAT, "signature": None})
        return unsigned.model_copy(update={"signature": key.sign(unsigned.signed_content())})

    def check_signature(self, key: CheckpointKey) -> str | None:
        """Why this manifest is not the job's to load under `key`; None when it is."""
        if not key.signs:
            if self.format == SIGNED_FORMAT:
                return (
                    f"it is signed, but this process has no checkpoint key to check it with "
                    f"({env.CHECKPOINT_KEY} is unset)"
                )
            return None
        if self.format != SIGNED_FORMAT or self.signature is None:
            return (
                "it is unsigned (written before this job's checkpoints were signed, or not by "
                "this job)"
            )
        if not key.matches(self.signed_content(), self.signature):
            return "its signature does not match this job's checkpoint key (not this job's)"
        if any(entry.sha256 is None for entry in self.files.values()):
            return "a file of its signed manifest has no SHA-256"
        return None


def describe_files(directory: Path, *, sha256: bool) -> dict[str, FileEntry]:
    """Sizes and checksums (the SHA-256 too when `sha256`, for a signed manifest) of every
    data file in a finished (not yet committed) copy."""
    entries: dict[str, FileEntry] = {}
    for path in sorted(directory.iterdir()):
        if path.name == MANIFEST_NAME or path.name.startswith(TEMP_PREFIX):
            continue
        if not path.is_file():
            raise CheckpointCorruptError(directory, f"unexpected non-file entry {path.name!r}")
        crc, digest = digest_file(path, sha256=sha256)
        entries[path.name] = FileEntry(size=path.stat().st_size, crc32=crc, sha256=digest)
    if not entries:
        raise CheckpointCorruptError(directory, "no data files to describe")
    return entries


def encode_manifest(manifest: CopyManifest) -> bytes:
    return json.dumps(manifest.model_dump(mode="json"), indent=1, sort_keys=True).encode()


def read_manifest(directory: Path) -> CopyManifest:
    """The manifest as written, parsed (no signature checked: `read_signed_manifest`)."""
    path = directory / MANIFEST_NAME
    try:
        with path.open("rb") as handle:
            raw = handle.read(MANIFEST_MAX_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointCorruptError(directory, f"{MANIFEST_NAME} is missing") from None
    if len(raw) > MANIFEST_MAX_BYTES:
        raise CheckpointCorruptError(
            directory, f"{MANIFEST_NAME} is larger than {MANIFEST_MAX_BYTES} bytes"
        )
    try:
        manifest = CopyManifest.model_validate_json(raw)
    except ValidationError as error:
        first = error_lines(error, root="(document)")[0]
        raise CheckpointCorruptError(
            directory, f"{MANIFEST_NAME} is not a valid manifest at {first}"
        ) from None
    manifest.check_names()
    return manifest


def read_signed_manifest(directory: Path, key: CheckpointKey) -> CopyManifest:
    """The manifest if it is the job's under `key` (signature checked), else raise."""
    manifest = read_manifest(directory)
    problem = manifest.check_signature(key)
    if problem is not None:
        raise CheckpointCorruptError(directory, f"{MANIFEST_NAME}: {problem}")
    return manifest


def verify_copy(
    directory: Path,
    *,
    step: int,
    attempt: int,
    key: CheckpointKey,
    node: str | None = None,
    deep: bool = True,
) -> CopyManifest:
    """Return the manifest if the copy is exactly what it claims to be, else raise.

    First the signature under the job's `key`, then the step and attempt, which come from
    the path and must match the manifest, so a manifest moved or written into another
    checkpoint's directory is rejected.  `deep=False` checks sizes only (for frequent
    inventory scans); restore and replication always go deep: the CRC-32, and for a signed
    copy the SHA-256, of every file.
    """
    manifest = read_signed_manifest(directory, key)
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
        if not deep:
            continue
        crc, digest = digest_file(path, sha256=entry.sha256 is not None)
        if crc != entry.crc32:
            raise CheckpointCorruptError(directory, f"file {name!r} fails its crc32 check")
        if digest != entry.sha256:
            raise CheckpointCorruptError(directory, f"file {name!r} fails its sha256 check")
    return manifest
