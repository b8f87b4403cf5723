"""Act as a ServiceAccount against the test control plane, with its own real credentials.

The chart's least-privilege claim is only proven by requests the API server authorizes as
that account: impersonation (`--as`) is evaluated by the same RBAC authorizer, but a token
from the TokenRequest API is what the operator's pod really presents, so everything here
uses one. `service_account_kubeconfig` writes a kubeconfig holding such a token; a kopf
operator (or kubectl, or the kubernetes client) started with KUBECONFIG pointing at it
runs with exactly the chart's permissions and nothing of the admin's.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from support.controlplane import ControlPlane

TOKEN_SECONDS = 3600
"""Long enough for any test; the API server's minimum for a TokenRequest is 10 minutes."""


def request_token(
    plane: ControlPlane, namespace: str, name: str, seconds: int = TOKEN_SECONDS
) -> str:
    """A bound token for the ServiceAccount from the TokenRequest API, issued by the admin."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": [plane.server], "expirationSeconds": seconds},
    }
    done = subprocess.run(
        plane.kubectl(
            "create",
            "--raw",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            "-f",
            "-",
        ),
        input=json.dumps(body),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"TokenRequest for {namespace}/{name} failed: {done.stderr.strip()}")
    token: str = json.loads(done.stdout)["status"]["token"]
    return token


@dataclass(frozen=True)
class ServiceAccountClient:
    """A kubeconfig that authenticates as one ServiceAccount, and kubectl calls with it."""

    plane: ControlPlane
    namespace: str
    name: str
    kubeconfig: Path

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    def kubectl(self, *args: str) -> list[str]:
        """argv of a kubectl call as the ServiceAccount (never the admin's credentials)."""
        return [str(self.plane.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.kubectl(*args),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=self.env(),
        )

    def env(self) -> dict[str, str]:
        """Environment of a child process (an operator) that must act as this account."""
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.plane.bin_dir}:{env.get('PATH', '')}"
        return env

    def can_i(
        self, verb: str, resource: str, namespace: str | None = None, subresource: str = ""
    ) -> bool:
        """`kubectl auth can-i` as the account itself (a SelfSubjectAccessReview); no
        namespace asks about all namespaces at once (what a ClusterRole grants)."""
        scope = ["--namespace", namespace] if namespace else ["--all-namespaces"]
        sub = [f"--subresource={subresource}"] if subresource else []
        done = self.run("auth", "can-i", verb, resource, *scope, *sub)
        answer = done.stdout.strip()
        if answer not in ("yes", "no"):
            raise RuntimeError(f"can-i {verb} {resource}: {done.stdout} {done.stderr}")
        return answer == "yes"


def service_account_kubeconfig(
    plane: ControlPlane, namespace: str, name: str, path: Path, seconds: int = TOKEN_SECONDS
) -> ServiceAccountClient:
    """Writes a kubeconfig (mode 0600) that authenticates with a fresh token of the account."""
    token = request_token(plane, namespace, name, seconds)
    user = f"{namespace}-{name}"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: stabletrain-test
  cluster:
    server: {plane.server}
    certificate-authority: {plane.ca.cert_path}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: {user}
  context:
    cluster: stabletrain-test
    user: {user}
    namespace: {namespace}
current-context: {user}
"""
    )
    path.chmod(0o600)
    return ServiceAccountClient(plane, namespace, name, path)
