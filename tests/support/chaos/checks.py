"""The end checks of a chaos run: every checkpoint that claims to be whole loads and holds
no NaN, and deleting the job leaves nothing of it behind.

Checkpoints are read the way nobody in the run did: every committed copy on every node's
local tier and every node's part on the PFS is verified deep (checksums) with the agent's
own verify_copy, then loaded whole with torch.distributed.checkpoint (no process group)
and every floating-point tensor in it checked for NaN and Inf. A copy that fails to verify
must be one the run tore on purpose; any other is a defect.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from kubernetes import client
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from stabletrain_agent.checkpoint.layout import iter_attempt_dirs, parse_node
from stabletrain_agent.checkpoint.manifest import CheckpointCorruptError, verify_copy
from stabletrain_agent.checkpoint.signing import CheckpointKey
from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION
from stabletrain_operator.naming import JOB_LABEL
from support.localnode import LocalCluster

Json = dict[str, Any]


@dataclass
class CheckpointReport:
    loaded: list[str] = field(default_factory=list)
    """Copies verified, loaded and finite."""
    torn: list[str] = field(default_factory=list)
    """Copies that fail to verify and were torn on purpose."""
    problems: list[str] = field(default_factory=list)
    """Anything else: a copy that fails to verify or load, or holds NaN/Inf."""


Copy = tuple[str, int, int, Path]
"""(label, step, attempt, directory) of one committed copy."""


def copies(cluster: LocalCluster, host_path: str, pfs_dir: Path) -> list[Copy]:
    """Every committed copy of the job, on both tiers."""
    found: list[Copy] = []
    for node in cluster.node_names:
        root = cluster.host_path(node, host_path)
        for part in sorted(root.glob("node-*")):
            found += [(f"local {node}/{part.name} step {s} attempt {a}", s, a, d)
                      for s, a, d in iter_attempt_dirs(part)]  # fmt: skip
    for step, attempt, directory in iter_attempt_dirs(pfs_dir):
        for part in sorted(directory.iterdir()):
            if part.is_dir() and parse_node(part.name) is not None:
                found.append(
                    (f"pfs {part.name} step {step} attempt {attempt}", step, attempt, part)
                )
    return found


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def load_and_check(directory: Path, step: int, attempt: int, key: CheckpointKey) -> str | None:
    """None if the copy verifies under the job's `key`, loads and is finite; else what is
    wrong."""
    try:
        verify_copy(directory, step=step, attempt=attempt, key=key, deep=True)
    except CheckpointCorruptError as error:
        return f"does not verify: {error.problem}"
    with tempfile.TemporaryDirectory(prefix="stabletrain-chaos-ckpt-") as scratch:
        target = Path(scratch) / "whole.pt"
        try:
            dcp_to_torch_save(directory, target)
            state = torch.load(target, weights_only=False)
        except Exception as error:  # whatever the loader raises is the finding
            return f"verifies but does not load: {type(error).__name__}: {error}"
    bad = [
        t for t in _tensors(state) if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if bad:
        return f"loads, but {len(bad)} tensor(s) hold NaN or Inf"
    return None


def check_checkpoints(
    cluster: LocalCluster, host_path: str, pfs_dir: Path, torn: Iterable[str], key: CheckpointKey
) -> CheckpointReport:
    """`torn`: the files the run damaged on purpose (a copy holding one is expected to fail);
    `key`: the job's checkpoint key (support.operator.checkpoint_key)."""
    damaged = [Path(p) for p in torn]
    report = CheckpointReport()
    for label, step, attempt, directory in copies(cluster, host_path, pfs_dir):
        problem = load_and_check(directory, step, attempt, key)
        if problem is None:
            report.loaded.append(label)
        elif any(d.parent == directory for d in damaged):
            report.torn.append(f"{label}: {problem}")
        else:
            report.problems.append(f"{label}: {problem}")
    return report


def leftovers(api_client: client.ApiClient, namespace: str, job: str) -> list[str]:
    """What of the job is still there: pods, Services, Secrets, ConfigMaps carrying its
    label or owned by it."""
    core: Any = client.CoreV1Api(api_client)
    found = []
    for kind, lister in (("pod", core.list_namespaced_pod),
                         ("service", core.list_namespaced_service),
                         ("secret", core.list_namespaced_secret),
                         ("configmap", core.list_namespaced_config_map)):  # fmt: skip
        for item in lister(namespace).items:
            labelled = (item.metadata.labels or {}).get(JOB_LABEL) == job
            owned = any(o.name == job for o in item.metadata.owner_references or [])
            if labelled or owned:
                found.append(f"{kind}/{item.metadata.name}")
    return found


def orphans_after_delete(
    api_client: client.ApiClient, namespace: str, job: str, timeout: float = 90.0
) -> list[str]:
    """Deletes the job (the operator running) and waits for its objects to go; returns what
    is still there after `timeout` (empty: nothing orphaned)."""
    custom: Any = client.CustomObjectsApi(api_client)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job)
        except client.ApiException as error:
            if error.status == 404:
                break
            raise
        time.sleep(0.5)
    left = leftovers(api_client, namespace, job)
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = leftovers(api_client, namespace, job)
    return left
