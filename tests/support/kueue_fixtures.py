"""pytest fixtures of the Kueue tests (registered from tests/conftest.py): Kueue's CRDs once
per session, its manager once per test module, and the operator run with --kueue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from support.controlplane import ControlPlane
from support.kueue import KueueManager, KueueObjects, install_kueue_crds, running_kueue
from support.operator import OperatorProcess, running_operator


@pytest.fixture(scope="session")
def kueue_crds(control_plane: ControlPlane) -> str:
    install_kueue_crds(control_plane)
    return "installed"


@pytest.fixture(scope="module")
def kueue(
    kueue_crds: str,
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KueueManager]:
    workdir = tmp_path_factory.mktemp("kueue")
    with running_kueue(control_plane, api_client, workdir) as manager:
        yield manager


@pytest.fixture
def kueue_objects(api_client: client.ApiClient) -> KueueObjects:
    return KueueObjects(api_client)


@pytest.fixture
def kueue_operator(
    kueue: KueueManager,
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    job_namespace: str,
    tmp_path: Path,
) -> Iterator[OperatorProcess]:
    """The operator with --kueue (started after Kueue, stopped before it)."""
    log = tmp_path / "operator.log"
    with running_operator(control_plane, api_client, job_namespace, log,
                          args=("--kueue",)) as running:  # fmt: skip
        yield running
