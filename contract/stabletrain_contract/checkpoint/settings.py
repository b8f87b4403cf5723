"""spec.checkpoints' saving and keeping, as the running pods apply them live.

The pod's env carries them at start (STABLETRAIN_CHECKPOINT_INTERVAL_STEPS and the
retentions), and every Directives carries them too, so an edit of the job's spec reaches
the running pods' checkpoint manager within seconds, at the same step on every rank (the
ranks adopt directives together), instead of at the next relaunch.
"""

from __future__ import annotations

from pydantic import Field

from stabletrain_contract.base import ContractModel


class CheckpointSettings(ContractModel):
    """What the checkpoint manager saves at and keeps (the spec's values, in its units)."""

    interval_steps: int = Field(ge=1, le=10_000_000)
    """Every multiple of this is a save step (spec.checkpoints.intervalSteps)."""
    keep_local: int = Field(ge=2, le=1000)
    """Regular checkpoints kept on each node's local tier (spec.checkpoints.local.retention;
    at least 2, the manager's own floor, so the rollback target survives a new save)."""
    keep_pfs: int = Field(ge=2, le=1000)
    """Regular checkpoints kept on the PFS (spec.checkpoints.pfs.retention)."""
    spike_markers: int = Field(ge=0, le=3)
    """Spike markers kept per tier (spec.checkpoints.spikeMarkers)."""
    local_size_limit_bytes: int | None = Field(default=None, ge=0)
    """Budget of the pod's part of the local tier (spec.checkpoints.local.sizeLimit); null:
    no budget beyond the retention."""
