"""The operator's own requests to the Kubernetes API server: JSON over one pool of kept
connections, with the credentials kopf logs in with.

The official Kubernetes client is not used. The operator sends and reads plain JSON on a
dozen paths, and importing that client loaded some 270 modules (every API group and model)
into a process that must stay small with a thousand jobs. kopf logs in with the same
credentials (handlers/startup.py), so its watches and these requests present one identity
whichever client libraries happen to be installed.

The credentials come from credentials.py; after a 401 they are read again, so a service
account token the kubelet rotated is picked up.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import ssl
import tempfile
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import kopf
import urllib3

from stabletrain_operator.credentials import credentials, kubeconfig_credentials

Json = dict[str, Any]

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

CONNECTION_POOL = 32
"""Connections to the API server kept for reuse: the reconciles' worker threads and a
launch's fan-out together (kube.FANOUT); more requests at once open connections that are
closed after use (`quiet_pool_overflow`)."""
_POOL_OVERFLOW = "Connection pool is full, discarding connection"

RETRIES = urllib3.Retry(total=3, redirect=0, raise_on_status=False)
"""urllib3's own rule, as the Kubernetes client had it: a refused connection is tried
again, and a 429 or 503 with Retry-After (the API server's "storage is (re)initializing"
right after a CRD is installed, or its priority and fairness shedding load) is sent again
after the wait it names if the method is idempotent; after three, the answer is returned."""
TIMEOUT = urllib3.Timeout(connect=10.0, read=30.0)
"""As kopf's own requests (handlers/startup.py): a request the API server does not answer
fails, and the next tick tries again."""


VERB_METHODS = {
    "get": "GET",
    "list": "GET",
    "create": "POST",
    "update": "PUT",
    "patch": "PATCH",
    "delete": "DELETE",
}
"""Kubernetes' verbs (what RBAC grants) as the HTTP methods of the requests."""


@dataclasses.dataclass(frozen=True)
class Resource:
    """One kind of object the operator reads or writes, and the verbs it uses on it.

    Every request names its Resource and verb, and a verb not declared here is refused
    before it is sent: the declarations are the complete list of what the operator does,
    which the chart's RBAC must grant (tests/unit/chart/test_chart_rbac_covers_operator.py
    checks that it does, and grants nothing more)."""

    group: str
    version: str
    plural: str
    verbs: frozenset[str]
    namespaced: bool = True
    subresource: str = ""
    custom: bool = False
    """A custom resource: patched as a JSON merge patch (strategic merge is built-in only)."""

    @property
    def rbac_resource(self) -> str:
        """The resource as an RBAC rule names it ("pods", "stabletrainingjobs/status")."""
        return f"{self.plural}/{self.subresource}" if self.subresource else self.plural

    def path(self, namespace: str = "", name: str = "") -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced:
            if not namespace:
                raise ValueError(f"{self.plural} are namespaced: a namespace is needed")
            root = f"{root}/namespaces/{namespace}"
        path = f"{root}/{self.plural}"
        if name:
            path = f"{path}/{name}"
        if self.subresource:
            if not name:
                raise ValueError(f"{self.rbac_resource} belongs to one object: a name is needed")
            path = f"{path}/{self.subresource}"
        return path


class ApiError(Exception):
    """The API server answered with an error status. `body` is its answer as text (a
    Kubernetes Status object, whose `message` names the problem)."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"{status} {reason}: {body[:500]}")
        self.status = status
        self.reason = reason
        self.body = body


def _decoded(data: str | bytes) -> bytes:
    """A kubeconfig's `*-data` field: base64 of PEM."""
    return base64.b64decode(data)


def ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext:
    """Verifies the server with the given CA (the system's when none is given) and presents
    the client certificate, if any."""
    cadata = _decoded(info.ca_data).decode() if info.ca_data else None
    cafile = os.fsdecode(info.ca_path) if info.ca_path else None
    context = ssl.create_default_context(cafile=cafile, cadata=cadata)
    if info.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if info.certificate_path or info.certificate_data:
        _load_client_certificate(context, info)
    return context


def _load_client_certificate(context: ssl.SSLContext, info: kopf.ConnectionInfo) -> None:
    """ssl reads a certificate and key only from files: data from a kubeconfig goes to a
    private directory for the moment of loading."""
    with tempfile.TemporaryDirectory(prefix="stabletrain-tls-") as private:
        certificate = _as_file(info.certificate_path, info.certificate_data, private, "tls.crt")
        key = _as_file(info.private_key_path, info.private_key_data, private, "tls.key")
        if certificate is None:
            raise kopf.LoginError("a client key is given without its certificate")
        context.load_cert_chain(certificate, key)


def _as_file(path: Any, data: str | bytes | None, directory: str, name: str) -> str | None:
    if path:
        return os.fsdecode(path)
    if not data:
        return None
    written = Path(directory) / name
    written.touch(mode=0o600)
    written.write_bytes(_decoded(data))
    return str(written)


def _not_pool_overflow(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_POOL_OVERFLOW)


def quiet_pool_overflow() -> None:
    """Drop urllib3's warning that a connection beyond CONNECTION_POOL was closed after use.

    That is how the pool is meant to work here: at 1,000 jobs the fan-outs of the reconcile
    threads run more requests at once than are worth keeping open, and the warning came in
    bursts of hundreds whenever jobs started or tripped, saying nothing to act on."""
    logging.getLogger("urllib3.connectionpool").addFilter(_not_pool_overflow)


def _headers(info: kopf.ConnectionInfo) -> dict[str, str]:
    headers = {"Accept": JSON, "User-Agent": "stabletrain-operator"}
    if info.token:
        headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
    elif info.username and info.password:
        headers.update(urllib3.make_headers(basic_auth=f"{info.username}:{info.password}"))
    return headers


@dataclasses.dataclass(frozen=True)
class _Connection:
    pool: urllib3.HTTPConnectionPool
    headers: dict[str, str]


def _connect(info: kopf.ConnectionInfo) -> _Connection:
    server = urlsplit(info.server)
    if server.scheme not in ("https", "http") or not server.hostname:
        raise kopf.LoginError(f"the API server address {info.server!r} is not an http(s) URL")
    options: Json = {"maxsize": CONNECTION_POOL, "timeout": TIMEOUT, "retries": RETRIES}
    pool: urllib3.HTTPConnectionPool
    if server.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            server.hostname, server.port or 443, ssl_context=ssl_context(info), **options
        )
    else:
        pool = urllib3.HTTPConnectionPool(server.hostname, server.port or 80, **options)
    return _Connection(pool, _headers(info))


class ApiServer:
    """JSON requests to one API server; safe to use from several threads at once."""

    def __init__(self, login: Callable[[], kopf.ConnectionInfo] = credentials) -> None:
        """`login` returns the connection info; it is called again after a 401."""
        self._login = login
        self._connection = _connect(login())

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = JSON,
    ) -> Json:
        """The answer's JSON; ApiError for an error status. A 401 logs in again once (a
        service account token the kubelet rotated)."""
        url = f"{path}?{urlencode(query)}" if query else path
        data = None if body is None else json.dumps(body).encode()
        connection = self._connection
        response = self._send(connection, method, url, data, content_type)
        if response.status == HTTPStatus.UNAUTHORIZED:
            stale, connection = connection, _connect(self._login())
            self._connection = connection
            stale.pool.close()  # its idle connections now; those in use as they come back
            response = self._send(connection, method, url, data, content_type)
        if response.status >= HTTPStatus.BAD_REQUEST:
            reason = response.reason or HTTPStatus(response.status).phrase
            raise ApiError(response.status, reason, response.data.decode(errors="replace"))
        answer: Json = json.loads(response.data) if response.data else {}
        return answer

    def call(
        self,
        verb: str,
        resource: Resource,
        *,
        namespace: str = "",
        name: str = "",
        body: object = None,
        query: dict[str, str] | None = None,
    ) -> Json:
        """One Kubernetes verb on `resource`; a verb it does not declare is a ValueError
        (declare it, and grant it in the chart's RBAC). A patch is a strategic merge patch
        on a built-in kind and a JSON merge patch on a custom resource."""
        if verb not in resource.verbs:
            raise ValueError(
                f"{verb} on {resource.rbac_resource} is not declared in its Resource (and so "
                "not granted by the chart's RBAC)"
            )
        content_type = JSON
        if verb == "patch":
            content_type = MERGE_PATCH if resource.custom else STRATEGIC_MERGE_PATCH
        path = resource.path(namespace, name)
        return self.request(VERB_METHODS[verb], path, body, query=query, content_type=content_type)

    @staticmethod
    def _send(
        connection: _Connection, method: str, url: str, data: bytes | None, content_type: str
    ) -> urllib3.BaseHTTPResponse:
        headers = connection.headers
        if data is not None:
            headers = {**headers, "Content-Type": content_type}
        return connection.pool.urlopen(method, url, body=data, headers=headers)

    def close(self) -> None:
        self._connection.pool.close()


def from_kubeconfig(path: str | os.PathLike[str]) -> ApiServer:
    """A client of the cluster a kubeconfig file names (tests, tools)."""
    return ApiServer(lambda: kubeconfig_credentials([os.fspath(path)]))
