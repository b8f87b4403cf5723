"""pytest fixtures of the operator tests (registered from tests/conftest.py): the CRD, a
namespace that can take pods and has the PFS claim, and the operator running against it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess, create_claim, install_crd, running_operator


@pytest.fixture(scope="session")
def stj_crd(control_plane: ControlPlane) -> str:
    install_crd(control_plane)
    return "installed"


@pytest.fixture
def job_namespace(
    stj_crd: str, api_client: client.ApiClient, pod_namespace: str, local_cluster: LocalCluster
) -> str:
    """A namespace for jobs, with the PFS claim, and the local node running to take the pods
    (set up before and torn down after the operator that depends on this)."""
    create_claim(client.CoreV1Api(api_client), pod_namespace)
    return pod_namespace


@pytest.fixture
def operator(
    control_plane: ControlPlane, api_client: client.ApiClient, job_namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    log = tmp_path / "operator.log"
    with running_operator(control_plane, api_client, job_namespace, log) as running:
        yield running


@pytest.fixture
def jobs(api_client: client.ApiClient, job_namespace: str) -> Jobs:
    return Jobs(api_client, job_namespace)
