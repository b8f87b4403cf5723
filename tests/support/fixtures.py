"""pytest fixtures: one real control plane per session, a fresh namespace per test."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
from kubernetes import client, config

from stabletrain_operator.apiserver import ApiServer, from_kubeconfig
from support.controlplane import ControlPlane, running_control_plane


def _interrupt_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A CI runner or a person stopping the run sends SIGTERM; turning it into
    # KeyboardInterrupt lets pytest run every fixture's teardown before it exits.
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with running_control_plane() as plane:
        yield plane


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(control_plane.kubeconfig)
    )
    yield api
    api.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="session")
def operator_api(control_plane: ControlPlane) -> Iterator[ApiServer]:
    """The operator's own client (apiserver.py) as the admin."""
    api = from_kubeconfig(control_plane.kubeconfig)
    yield api
    api.close()


@pytest.fixture
def namespace(api_client: client.ApiClient, control_plane: ControlPlane) -> Iterator[str]:
    """A namespace of its own for one test, deleted (without waiting) afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    control_plane.check_alive()
    body: Any = client.V1DeleteOptions(propagation_policy="Background")
    core.delete_namespace(name, body=body)
