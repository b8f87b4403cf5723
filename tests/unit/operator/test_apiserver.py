"""The operator's own API client without a cluster: where a request goes, what an error
carries, a second login after a 401, and which kubeconfigs it reads or refuses (the
integration tests run it against the real API server with certificates and tokens)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import kopf
import pytest

from stabletrain_operator.apiserver import ApiError, ApiServer, Resource
from stabletrain_operator.credentials import (
    NoCredentialsError,
    credentials,
    kubeconfig_credentials,
)
from stabletrain_operator.kube import JOB_STATUS, NODES, PODS
from support.loopback_http import serving


def test_paths_of_namespaced_cluster_and_subresources() -> None:
    assert PODS.path("ml") == "/api/v1/namespaces/ml/pods"
    assert PODS.path("ml", "gpt-a1-0") == "/api/v1/namespaces/ml/pods/gpt-a1-0"
    assert NODES.path(name="node-a") == "/api/v1/nodes/node-a"
    assert JOB_STATUS.path("ml", "gpt") == (
        "/apis/stabletrain.dev/v1alpha1/namespaces/ml/stabletrainingjobs/gpt/status"
    )
    with pytest.raises(ValueError, match="namespaced"):
        PODS.path()
    with pytest.raises(ValueError, match="a name is needed"):
        JOB_STATUS.path("ml")


@dataclass
class Scripted:
    """One answer per request, in order, and every request as it came."""

    url: str = ""
    script: list[tuple[int, object]] = field(default_factory=list)
    seen: list[tuple[str, str, dict[str, str], str]] = field(default_factory=list)


def _answering(scripted: Scripted) -> type[BaseHTTPRequestHandler]:
    class Recorded(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            scripted.seen.append((self.command, self.path, dict(self.headers), body))
            status, answer = scripted.script.pop(0)
            data = json.dumps(answer).encode()
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", "0")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer  # noqa: N815 (http.server)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Recorded


@pytest.fixture
def server() -> Iterator[Scripted]:
    scripted = Scripted()
    with serving(_answering(scripted)) as url:
        scripted.url = url
        yield scripted


def _login(server: Scripted, tokens: list[str]) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(server=server.url, token=tokens.pop(0))


def test_a_patch_of_a_custom_resource_is_a_merge_patch_and_of_a_pod_a_strategic_one(
    server: Scripted,
) -> None:
    api = ApiServer(lambda: _login(server, ["t"]))
    server.script = [(200, {"status": {"phase": "Stopping"}}), (200, {})]
    written = api.call("patch", JOB_STATUS, namespace="ml", name="gpt", body={"status": {}})
    api.call("patch", PODS, namespace="ml", name="p", body={"metadata": {"labels": {}}})
    api.close()
    assert written == {"status": {"phase": "Stopping"}}
    (method, path, headers, body), (_, _, pod_headers, _) = server.seen
    assert (method, path, body) == (
        "PATCH", "/apis/stabletrain.dev/v1alpha1/namespaces/ml/stabletrainingjobs/gpt/status",
        '{"status": {}}',
    )  # fmt: skip
    assert headers["Content-Type"] == "application/merge-patch+json"
    assert headers["Authorization"] == "Bearer t"
    assert pod_headers["Content-Type"] == "application/strategic-merge-patch+json"


def test_an_error_carries_the_status_and_the_api_servers_words(server: Scripted) -> None:
    api = ApiServer(lambda: _login(server, ["t"]))
    refusal = {"kind": "Status", "message": 'pods "p" is forbidden: violates PodSecurity'}
    server.script = [(403, refusal)]
    with pytest.raises(ApiError) as refused:
        api.call("create", PODS, namespace="ml", body={"kind": "Pod"}, query={"dryRun": "All"})
    api.close()
    assert refused.value.status == 403
    assert refused.value.reason == "Forbidden"
    assert json.loads(refused.value.body) == refusal
    assert server.seen[0][1] == "/api/v1/namespaces/ml/pods?dryRun=All"


def test_a_401_logs_in_again_once_and_sends_the_new_token(server: Scripted) -> None:
    """A service account token the kubelet rotated: the next login reads the new one."""
    tokens = ["old", "new", "newer"]
    api = ApiServer(lambda: _login(server, tokens))
    server.script = [(401, {}), (200, {"items": []}), (401, {}), (401, {})]
    assert api.call("list", PODS, namespace="ml") == {"items": []}
    with pytest.raises(ApiError) as refused:
        api.call("list", PODS, namespace="ml")
    api.close()
    assert refused.value.status == 401, "a second 401 in a row is the answer"
    sent = [headers["Authorization"] for _, _, headers, _ in server.seen]
    assert sent == ["Bearer old", "Bearer new", "Bearer new", "Bearer newer"]


def test_a_read_the_api_server_sheds_with_retry_after_is_sent_again(
    server: Scripted,
) -> None:
    """429 "storage is (re)initializing" right after a CRD is installed: a read waits what
    Retry-After says and asks again; a write is not repeated (it gets the 429)."""
    api = ApiServer(lambda: _login(server, ["t"]))
    shed = {"kind": "Status", "message": "storage is (re)initializing"}
    server.script = [(429, shed), (429, shed), (200, {"items": []}), (429, shed)]
    assert api.call("list", PODS, namespace="ml") == {"items": []}
    with pytest.raises(ApiError) as refused:
        api.call("create", PODS, namespace="ml", body={"kind": "Pod"})
    api.close()
    assert refused.value.status == 429
    assert [method for method, *_ in server.seen] == ["GET", "GET", "GET", "POST"]


def test_an_undeclared_verb_is_refused_without_a_request(server: Scripted) -> None:
    api = ApiServer(lambda: _login(server, ["t"]))
    read_only = Resource("", "v1", "namespaces", frozenset({"get"}), namespaced=False)
    with pytest.raises(ValueError, match="delete on namespaces is not declared"):
        api.call("delete", read_only, name="ml")
    api.close()
    assert server.seen == []


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


CLUSTER = """
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: pki/ca.crt}
"""


def test_a_kubeconfigs_relative_files_are_read_beside_it(tmp_path: Path) -> None:
    config = _write(tmp_path / "admin.kubeconfig", CLUSTER + """
users:
- name: admin
  user: {client-certificate: pki/admin.crt, client-key: /abs/admin.key}
contexts:
- name: admin
  context: {cluster: local, user: admin, namespace: ml}
current-context: admin
""")  # fmt: skip
    info = kubeconfig_credentials([str(config)])
    assert info.server == "https://127.0.0.1:6443"
    assert info.ca_path == str(tmp_path / "pki" / "ca.crt")
    assert info.certificate_path == str(tmp_path / "pki" / "admin.crt")
    assert info.private_key_path == "/abs/admin.key"
    assert info.default_namespace == "ml"


def test_the_first_kubeconfig_naming_a_user_wins(tmp_path: Path) -> None:
    first = _write(tmp_path / "first", """
users:
- name: me
  user: {token: first-token}
current-context: mine
""")  # fmt: skip
    second = _write(tmp_path / "second", CLUSTER + """
users:
- name: me
  user: {token: second-token}
contexts:
- name: mine
  context: {cluster: local, user: me}
current-context: other
""")  # fmt: skip
    info = kubeconfig_credentials([str(first), str(second)])
    assert info.token == "first-token"


@pytest.mark.parametrize(
    ("user", "words"),
    [
        ("{exec: {command: aws}}", "runs a plugin, which the operator does not"),
        ("{auth-provider: {name: gcp}}", "runs a plugin, which the operator does not"),
    ],
)
def test_a_kubeconfig_the_operator_cannot_use_is_refused_with_why(
    tmp_path: Path, user: str, words: str
) -> None:
    config = _write(tmp_path / "config", CLUSTER + f"""
users:
- name: cloud
  user: {user}
contexts:
- name: cloud
  context: {{cluster: local, user: cloud}}
current-context: cloud
""")  # fmt: skip
    with pytest.raises(NoCredentialsError, match=words):
        kubeconfig_credentials([str(config)])


def test_a_context_naming_an_undefined_user_is_refused(tmp_path: Path) -> None:
    config = _write(tmp_path / "config", CLUSTER + """
contexts:
- name: broken
  context: {cluster: local, user: nobody}
current-context: broken
""")  # fmt: skip
    with pytest.raises(NoCredentialsError, match="names 'nobody', which it does not define"):
        kubeconfig_credentials([str(config)])


def test_no_credentials_at_all_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        pytest.skip("this machine is a pod with a service account")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(NoCredentialsError, match=r"no kubeconfig \(KUBECONFIG or ~/.kube/config\)"):
        credentials()
