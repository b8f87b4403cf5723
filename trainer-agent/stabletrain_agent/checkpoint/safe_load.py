"""Loading a verified copy without running anything it contains.

torch.distributed.checkpoint unpickles two things from the files it reads: the copy's
`.metadata` (plain `pickle.load`) and every non-tensor value (`torch.load(...,
weights_only=False)` in its default load planner); tensors already go through
`weights_only=True`. The manifest's signature (signing.py) is what makes a copy this job's,
and it is checked first; these readers are the second wall, for a copy changed between its
check and its load, or a key that leaked:

- the `.metadata` bytes are read once, held to the SHA-256 (or, unsigned, the CRC-32) the
  verified manifest gives for them, and unpickled from those same bytes by an unpickler that
  knows only the classes a DCP metadata file is made of;
- every other value is loaded with `weights_only=True` (tensors, containers, numbers,
  strings, bytes), never with arbitrary classes.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import zlib
from pathlib import Path, PosixPath, PurePosixPath
from typing import Any

import torch
from torch.distributed.checkpoint import filesystem, metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.planner import ReadItem

from stabletrain_agent.checkpoint.manifest import CheckpointCorruptError, CopyManifest

METADATA_NAME = ".metadata"
"""torch.distributed.checkpoint's metadata file (filesystem._metadata_fn)."""

_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("pathlib", "PosixPath"): PosixPath,
    ("pathlib", "PurePosixPath"): PurePosixPath,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): filesystem._StorageInfo,
    **{
        ("torch.distributed.checkpoint.metadata", name): getattr(metadata, name)
        for name in (
            "Metadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    },
}
"""Every global a DCP metadata file of torch 2.9 refers to (besides torch's dtypes): plain
records and enums whose construction runs no code of the file's choosing."""


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata and nothing else: any other global is refused by name."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED.get((module, name))
        if allowed is not None:
            return allowed
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of checkpoint metadata")


def load_metadata(directory: Path, manifest: CopyManifest) -> metadata.Metadata:
    """The copy's DCP metadata: its bytes read once, held to the verified manifest's digest
    of them, unpickled by the allow-list. CheckpointCorruptError when any of it fails (a
    restore checks this before it chooses the copy, and the load does it again)."""
    raw = _read_checked(directory, manifest, METADATA_NAME)
    try:
        loaded = _MetadataUnpickler(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as error:
        raise CheckpointCorruptError(
            directory, f"{METADATA_NAME} is not checkpoint metadata: {error}"
        ) from None
    if not isinstance(loaded, metadata.Metadata):
        raise CheckpointCorruptError(directory, f"{METADATA_NAME} holds a {type(loaded).__name__}")
    return loaded


def _read_checked(directory: Path, manifest: CopyManifest, name: str) -> bytes:
    """The file's bytes, held to the manifest's digest of them (read exactly once)."""
    entry = manifest.files.get(name)
    if entry is None:
        raise CheckpointCorruptError(directory, f"the manifest does not list {name!r}")
    with (directory / name).open("rb") as handle:
        raw = handle.read(entry.size + 1)
    if len(raw) != entry.size:
        raise CheckpointCorruptError(directory, f"file {name!r} changed size since it was verified")
    if entry.sha256 is not None:
        matches = hashlib.sha256(raw).hexdigest() == entry.sha256
    else:
        matches = f"{zlib.crc32(raw):08x}" == entry.crc32
    if not matches:
        raise CheckpointCorruptError(directory, f"file {name!r} changed since it was verified")
    return raw


class VerifiedReader(FileSystemReader):
    """A FileSystemReader of one verified copy whose metadata is read by `load_metadata`."""

    def __init__(self, directory: Path, manifest: CopyManifest) -> None:
        super().__init__(directory)
        self._directory = directory
        self._manifest = manifest

    def read_metadata(self, *args: Any, **kwargs: Any) -> metadata.Metadata:
        if kwargs.get("rank") is not None:
            raise CheckpointCorruptError(self._directory, "per-rank metadata is not written here")
        loaded = load_metadata(self._directory, self._manifest)
        if loaded.storage_meta is None:
            loaded.storage_meta = metadata.StorageMeta()
        loaded.storage_meta.load_id = self.load_id
        return loaded


class WeightsOnlyPlanner(DefaultLoadPlanner):
    """DCP's default load planner, loading non-tensor values with `weights_only=True`."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
