"""How API errors read: the server's own sentence plus what to do, per status code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stabletrain_operator.cli.cluster import Cluster
from stabletrain_operator.cli.errors import CliError


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A client that never connects: every request below fails before reaching a socket."""
    api = client.ApiClient(client.Configuration(host="https://api.example.invalid:6443"))
    yield Cluster(api, "ml")
    api.close()


def failing(status: int, body: object) -> ApiException:
    text = body if isinstance(body, str) else json.dumps(body)
    return ApiException(status=status, reason="Some Reason", body=text)


def explain(cluster: Cluster, error: ApiException, *, name: str | None = "a") -> str:
    def raise_it() -> object:
        raise error

    with pytest.raises(CliError) as raised:
        cluster._call("get StableTrainingJob ml/a", raise_it, name=name)
    return str(raised.value)


def test_not_found_object_versus_api_not_installed(cluster: Cluster) -> None:
    missing = failing(404, {"kind": "Status", "message": "not found", "details": {"name": "a"}})
    assert explain(cluster, missing) == "StableTrainingJob 'a' not found in namespace ml"
    no_crd = failing(
        404, {"kind": "Status", "message": "the server could not find the requested resource"}
    )
    assert (
        "is not installed on https://api.example.invalid:6443; apply crds/stabletrainingjobs.yaml"
        in explain(cluster, no_crd)
    )


def test_conflict_and_other_statuses(cluster: Cluster) -> None:
    assert "changed while this command ran; run it again" in explain(cluster, failing(409, {}))
    text = explain(cluster, failing(500, "<html>oops</html>"))
    assert text == "cannot get StableTrainingJob ml/a: 500 Some Reason: <html>oops</html>"


def test_the_namespace_is_the_chosen_contexts_not_the_current_ones(tmp_path: Path) -> None:
    """`--context prod` listed the current context's namespace on prod's cluster."""
    kubeconfig = tmp_path / "config"
    contexts = [("dev", "https://dev.example.invalid", "team-dev"),
                ("prod", "https://prod.example.invalid", "team-prod"),
                ("bare", "https://bare.example.invalid", None)]  # fmt: skip
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "dev",
        "clusters": [{"name": n, "cluster": {"server": url}} for n, url, _ in contexts],
        "users": [{"name": "me", "user": {"token": "t"}}],
        "contexts": [{"name": n, "context": {"cluster": n, "user": "me",
                      **({"namespace": ns} if ns else {})}} for n, _, ns in contexts],
    }))  # fmt: skip

    def connect(**options: str | None) -> tuple[str, str]:
        chosen = {"kubeconfig": str(kubeconfig), "namespace": None, "context": None, **options}
        cluster = Cluster.connect(**chosen)
        cluster.close()
        return cluster.server, cluster.namespace

    assert connect() == ("https://dev.example.invalid", "team-dev")
    assert connect(context="prod") == ("https://prod.example.invalid", "team-prod")
    assert connect(context="bare") == ("https://bare.example.invalid", "default")
    assert connect(context="prod", namespace="ml") == ("https://prod.example.invalid", "ml")
