"""pytest fixtures of the local node, and the end-of-session proof that nothing was left behind.

Registered from tests/conftest.py. `local_cluster` gives a test two nodes, node-a and node-b,
on the session's control plane; everything it started is stopped when the test ends, passed or
not.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from support.controlplane import ControlPlane
from support.localnode.api import RawApi
from support.localnode.cluster import LocalCluster
from support.localnode.leftovers import find_leftovers, summary
from support.localnode.registry import CREATED


@pytest.fixture
def local_cluster(
    api_client: client.ApiClient, control_plane: ControlPlane
) -> Iterator[LocalCluster]:
    with LocalCluster(api_client, nodes=("node-a", "node-b")) as cluster:
        yield cluster
    control_plane.check_alive()


@pytest.fixture
def pod_namespace(namespace: str, api_client: client.ApiClient) -> str:
    """A fresh namespace that can take pods: kube-controller-manager has made its default
    ServiceAccount (admission rejects pods before that) and its kube-root-ca.crt ConfigMap
    (every service-account token volume projects it)."""
    api = RawApi(api_client)
    base = f"/api/v1/namespaces/{namespace}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        account = api.get(f"{base}/serviceaccounts/default")
        if account is not None and api.get(f"{base}/configmaps/kube-root-ca.crt"):
            return namespace
        time.sleep(0.1)
    raise RuntimeError(f"namespace {namespace}: no default ServiceAccount after 30 s")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not CREATED.markers:
        return
    leftovers = find_leftovers()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"local node leftover check ({summary()}): " + ("none" if not leftovers else "")]
    lines += [f"  LEFTOVER {item}" for item in leftovers]
    for line in lines:
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line)
    if leftovers:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
