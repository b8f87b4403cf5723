"""Who the operator is to the API server: the pod's service account, else a kubeconfig.

One source for kopf's login (handlers/startup.py) and the operator's own requests
(apiserver.py). A kubeconfig user that runs an exec or auth-provider plugin is refused
with that reason: the operator runs in a pod, and the tests and a developer's cluster use
client certificates or tokens.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import kopf
import yaml

Json = dict[str, Any]


class NoCredentialsError(kopf.LoginError):
    """No credentials the operator can use: none at all, or a kubeconfig it cannot read."""


def credentials() -> kopf.ConnectionInfo:
    """In-cluster service account when running in a pod, else the kubeconfig (tests, dev).

    kopf's own service account login names the API server by its DNS name; the address the
    kubelet puts in the pod's environment is used instead, as every Kubernetes client does,
    so the operator does not depend on cluster DNS."""
    in_cluster = kopf.login_with_service_account(settings=kopf.OperatorSettings())
    if in_cluster is not None:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT")
        if host and port:
            host = f"[{host}]" if ":" in host else host
            in_cluster = dataclasses.replace(in_cluster, server=f"https://{host}:{port}")
        return in_cluster
    named = os.environ.get("KUBECONFIG") or ""
    paths = [os.path.expanduser(p.strip()) for p in named.split(os.pathsep) if p.strip()]
    default = Path("~/.kube/config").expanduser()
    if not paths and default.exists():
        paths = [str(default)]
    if not paths:
        raise NoCredentialsError(
            "no credentials for the API server: no service account token "
            "(/var/run/secrets/kubernetes.io/serviceaccount/token) and no kubeconfig "
            "(KUBECONFIG or ~/.kube/config)"
        )
    return kubeconfig_credentials(paths)


def kubeconfig_credentials(paths: list[str]) -> kopf.ConnectionInfo:
    """The current context's cluster and user; with several files, the first one that
    names a context, cluster or user wins (kubectl's merge rule). Relative paths in a file
    are relative to that file, as kubectl reads them."""
    current: str | None = None
    contexts: Json = {}
    clusters: Json = {}
    users: Json = {}
    for path in paths:
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        current = current or config.get("current-context")
        base = Path(path).parent
        for section, into in (("contexts", contexts), ("clusters", clusters), ("users", users)):
            for item in config.get(section) or []:
                into.setdefault(item["name"], (base, item.get(section[:-1]) or {}))
    if not current or current not in contexts:
        raise NoCredentialsError(f"the kubeconfig {os.pathsep.join(paths)} sets no current context")
    _, context = contexts[current]
    try:
        cluster_base, cluster = clusters[context["cluster"]]
        user_base, user = users[context["user"]]
    except KeyError as missing:
        raise NoCredentialsError(
            f"the kubeconfig's context {current} names {missing}, which it does not define"
        ) from None
    if "exec" in user or "auth-provider" in user:
        raise NoCredentialsError(
            f"the kubeconfig user of context {current} runs a plugin, which the operator "
            "does not; give it a client certificate or a token"
        )

    def file(base: Path, value: str | None) -> str | None:
        return None if not value else str(base / os.path.expanduser(value))

    return kopf.ConnectionInfo(
        server=cluster["server"],
        ca_path=file(cluster_base, cluster.get("certificate-authority")),
        ca_data=cluster.get("certificate-authority-data"),
        insecure=cluster.get("insecure-skip-tls-verify"),
        certificate_path=file(user_base, user.get("client-certificate")),
        certificate_data=user.get("client-certificate-data"),
        private_key_path=file(user_base, user.get("client-key")),
        private_key_data=user.get("client-key-data"),
        token=user.get("token") or _read(file(user_base, user.get("tokenFile"))),
        username=user.get("username"),
        password=user.get("password"),
        default_namespace=context.get("namespace"),
    )


def _read(path: str | None) -> str | None:
    return None if path is None else Path(path).read_text(encoding="utf-8").strip()
