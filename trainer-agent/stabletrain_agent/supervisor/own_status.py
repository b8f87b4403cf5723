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
from typing import Any

from stabletrain_agent.checkpoint.inventory_scan import TierDirs, VerifyCache, scan_tiers
from stabletrain_agent.checkpoint.signing import CheckpointKey
from stabletrain_contract import env
from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.checkpoint.inventory import CheckpointRecord
from stabletrain_contract.directives import Directives

_log = logging.getLogger(__name__)


class TierScan:
    """This pod's checkpoints on its memory tier, its local tier and the PFS, as the agent
    would list them (stabletrain_agent.checkpoint.inventory_scan)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        try:
            self._tiers: TierDirs | None = TierDirs.from_env(environ)
        except ValueError as error:
            _log.warning("supervisor: no checkpoint scan: %s", error)
            self._tiers = None
        self._cache = VerifyCache(CheckpointKey.from_env(environ))

    @property
    def pod(self) -> str | None:
        return self._tiers.pod if self._tiers is not None else None

    def records(self) -> tuple[list[CheckpointRecord], bool | None, str]:
        """The records, whether the PFS could be read, and why not. None instead of a bool
        when the scan is no evidence of what exists: no tiers, or nothing in the agent's
        layout on them (a script that keeps its checkpoints its own way), so the operator
        adds what the scan found and forgets nothing it knew."""
        if self._tiers is None:
            return [], None, ""
        try:
            records = scan_tiers(self._tiers, self._cache)
        except OSError as error:
            return [], False, f"checkpoint scan failed: {error}"[:1024]
        if not records:
            return [], None, ""
        readable = self._tiers.pfs_root.is_dir()
        return records, readable, "" if readable else f"{self._tiers.pfs_root} not readable"


def own_status(
    environ: Mapping[str, str], attempt: int, directives: Directives | None, scan: TierScan
) -> dict[str, Any]:
    """An AgentStatus document built without the training process: a scan that found the
    agent's checkpoints counts as fresh (pfsAvailable set), so the operator's inventory
    takes it as what exists now."""
    records, pfs_available, pfs_message = scan.records()
    status = AgentStatus(
        attempt=attempt,
        node=environ.get(env.NODE_NAME) or os.uname().nodename,
        node_rank=int(environ.get(env.NODE_RANK) or "0"),
        pod=scan.pod,
        updated_at=datetime.now(UTC),
        lr_scale=directives.lr_scale if directives is not None else 1.0,
        applied_generation=directives.generation if directives is not None else 0,
        inventory=tuple(records),
        pfs_available=pfs_available,
        pfs_message=pfs_message,
        replicating=None if pfs_available is None else (),  # no process left to send any
    )
    document: dict[str, Any] = status.model_dump(mode="json", by_alias=True)
    return document
