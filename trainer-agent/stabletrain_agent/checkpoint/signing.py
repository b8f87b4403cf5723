"""The job's checkpoint key: only copies signed with it are ever loaded.

Restoring a checkpoint unpickles parts of it (torch.distributed.checkpoint's metadata, a
framework's state), and a tier may be writable by more than this job: another job on the
same hostPath or claim. The manifest's CRC-32 finds accidents, not an author, so every
manifest of a job with a key carries an HMAC-SHA256, under the key, of its own content,
which lists each file's size and SHA-256: a copy whose signature, or any file's digest, does
not match was not written by this job (or was changed since) and is refused before a byte
of it is unpickled.

The key comes from the job's Secret (STABLETRAIN_CHECKPOINT_KEY). Without one (a job
created before signing, a run outside the operator) manifests are written unsigned, and
only unsigned ones are read: a process cannot check a signature it has no key for.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from stabletrain_contract import env

SIGNATURE_PATTERN = r"^[0-9a-f]{64}$"


@dataclass(frozen=True)
class CheckpointKey:
    """The job's key (None: the job signs nothing and accepts only unsigned copies)."""

    secret: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> CheckpointKey:
        raw = environ.get(env.CHECKPOINT_KEY, "")
        return cls(raw.encode() if raw else None)

    @property
    def signs(self) -> bool:
        return self.secret is not None

    def sign(self, content: bytes) -> str:
        if self.secret is None:
            raise ValueError(f"no checkpoint key ({env.CHECKPOINT_KEY} is unset): cannot sign")
        return hmac.new(self.secret, content, hashlib.sha256).hexdigest()

    def matches(self, content: bytes, signature: str) -> bool:
        """Constant-time check of a signature (False without a key)."""
        if self.secret is None:
            return False
        return hmac.compare_digest(self.sign(content), signature)


UNSIGNED = CheckpointKey()
"""What a process without a key uses: writes unsigned manifests, reads only those."""
