"""The status a pod shows while no training agent answers: the supervisor's own.

Between two attempts, after a crash, or while a process hangs, the pod still answers its
status endpoint with what does not need the training process: which attempt, which node,
and which checkpoints this pod's tiers hold, scanned by the supervisor itself (torch-free,
the same verification as the agent's scan). So a rank that died without a word still hands
over the checkpoints it completed, and the operator plans from what is really on disk.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stabletrain_agent.checkpoint.inventory_scan import (
    VerifyCache,
    build_records,
    combined_fence,
    scan_local,
    scan_pfs,
)
from stabletrain_agent.checkpoint.layout import local_part_root
from stabletrain_agent.contract import env
from stabletrain_agent.contract.channel import AgentStatus
from stabletrain_agent.contract.checkpoint_inventory import CheckpointRecord
from stabletrain_agent.contract.directives import Directives

_log = logging.getLogger(__name__)


class TierScan:
    """This pod's checkpoints on its local tier and the PFS, as the agent would list them."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        local = environ.get(env.LOCAL_CHECKPOINT_DIR)
        pfs = environ.get(env.PFS_CHECKPOINT_DIR)
        self._local_root = Path(local) if local else None
        self._pfs_root = Path(pfs) if pfs else None
        self._node = environ.get(env.NODE_NAME) or os.uname().nodename
        self._part = environ.get(env.NODE_RANK) or environ.get(env.GROUP_RANK) or "0"
        self._cache = VerifyCache()

    def records(self) -> list[CheckpointRecord]:
        if self._local_root is None or self._pfs_root is None:
            return []
        local_dir = local_part_root(self._local_root, self._part)
        try:
            fence = combined_fence([local_dir, self._pfs_root])
            local = scan_local(local_dir, self._part, self._cache) if local_dir.is_dir() else {}
            try:
                pfs = scan_pfs(self._pfs_root, self._cache) if self._pfs_root.is_dir() else {}
            except OSError:
                pfs = {}
            return build_records(self._node, local, pfs, fence)
        except OSError as error:
            _log.warning("supervisor: checkpoint scan failed: %s", error)
            return []


def own_status(
    environ: Mapping[str, str], attempt: int, directives: Directives | None, scan: TierScan
) -> dict[str, Any]:
    """An AgentStatus document built without the training process."""
    status = AgentStatus(
        attempt=attempt,
        node=environ.get(env.NODE_NAME) or os.uname().nodename,
        node_rank=int(environ.get(env.NODE_RANK) or "0"),
        updated_at=datetime.now(UTC),
        lr_scale=directives.lr_scale if directives is not None else 1.0,
        applied_generation=directives.generation if directives is not None else 0,
        inventory=tuple(scan.records()),
    )
    document: dict[str, Any] = status.model_dump(mode="json", by_alias=True)
    return document
