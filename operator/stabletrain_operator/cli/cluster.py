"""The CLI's only door to the cluster: StableTrainingJobs through the Kubernetes API.

Every failure a person can meet at a terminal (no kubeconfig, an unreachable server,
RBAC, a missing job, a CRD that is not installed) becomes a CliError with a sentence that
says what happened and what to do, never a traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from stabletrain_operator.api.constants import GROUP, KIND, PLURAL, VERSION
from stabletrain_operator.cli.errors import CliError

REQUEST_TIMEOUT = (5.0, 30.0)
"""(connect, read) seconds: a dead server fails fast, a slow one gets time to answer."""
CONNECT_RETRIES = 1
"""One retry rides out a blip; more only delays the answer when the server is down."""
MERGE_PATCH = "application/merge-patch+json"
DEFAULT_KUBECONFIG = "~/.kube/config"


class Cluster:
    """StableTrainingJobs in one namespace, as the current kubeconfig user sees them."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        self._api_client = api_client
        self._objects = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.server: str = api_client.configuration.host

    @classmethod
    def connect(
        cls, *, kubeconfig: str | None, namespace: str | None, context: str | None
    ) -> Cluster:
        path = kubeconfig or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
        files = [Path(p).expanduser() for p in path.split(os.pathsep) if p]
        if not any(f.is_file() for f in files):
            if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                return cls._in_cluster(namespace)
            raise CliError(
                f"no cluster configured: kubeconfig {path} does not exist; pass "
                "--kubeconfig or set KUBECONFIG"
            )
        configuration = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
            contexts, active = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
        except ConfigException as error:
            raise CliError(f"cannot use kubeconfig {path}: {error}") from None
        except yaml.YAMLError as error:
            raise CliError(f"kubeconfig {path} is not valid YAML: {error}") from None
        except (OSError, ValueError, TypeError, AttributeError) as error:
            raise CliError(f"cannot read kubeconfig {path}: {error}") from None
        configuration.retries = CONNECT_RETRIES
        api_client = client.ApiClient(configuration)
        if context is not None:  # --context: its namespace, not the current context's
            active = next((c for c in contexts if c.get("name") == context), None)
        chosen = namespace or ((active or {}).get("context") or {}).get("namespace") or "default"
        return cls(api_client, chosen)

    @classmethod
    def _in_cluster(cls, namespace: str | None) -> Cluster:
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException as error:
            raise CliError(f"no kubeconfig and no usable in-cluster config: {error}") from None
        service_account_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        default = service_account_ns.read_text().strip() if service_account_ns.exists() else None
        return cls(client.ApiClient(configuration), namespace or default or "default")

    def close(self) -> None:
        self._api_client.close()

    def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self._call(
            f"get {KIND} {self.namespace}/{name}",
            lambda: self._objects.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT
            ),
            name=name,
        )
        return found

    def list_jobs(self, *, all_namespaces: bool) -> list[dict[str, Any]]:
        if all_namespaces:
            listed = self._call(
                f"list {KIND}s in all namespaces",
                lambda: self._objects.list_cluster_custom_object(
                    GROUP, VERSION, PLURAL, _request_timeout=REQUEST_TIMEOUT
                ),
            )
        else:
            listed = self._call(
                f"list {KIND}s in namespace {self.namespace}",
                lambda: self._objects.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, _request_timeout=REQUEST_TIMEOUT
                ),
            )
        items: list[dict[str, Any]] = listed.get("items", [])
        return sorted(items, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))

    def patch_spec(
        self, name: str, patch: dict[str, Any], *, resource_version: str | None = None
    ) -> dict[str, Any]:
        """A JSON merge patch of the job's spec (the status belongs to the operator).

        With `resource_version` the server refuses the patch (409) if the job changed since
        it was read, so a decision taken on what was read cannot overwrite a newer request.
        """
        body: dict[str, Any] = {"spec": patch}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        patched: dict[str, Any] = self._call(
            f"patch {KIND} {self.namespace}/{name}",
            lambda: self._objects.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                body,
                _content_type=MERGE_PATCH,
                _request_timeout=REQUEST_TIMEOUT,
            ),
            name=name,
        )
        return patched

    def events(self, name: str) -> list[dict[str, Any]]:
        """core/v1 Events about the job (what kopf and the operator post), as plain JSON."""
        core = client.CoreV1Api(self._api_client)
        listed = self._call(
            f"list Events of {KIND} {self.namespace}/{name}",
            lambda: core.list_namespaced_event(
                self.namespace,
                field_selector=f"involvedObject.kind={KIND},involvedObject.name={name}",
                _request_timeout=REQUEST_TIMEOUT,
            ),
        )
        plain: dict[str, Any] = self._api_client.sanitize_for_serialization(listed)
        items: list[dict[str, Any]] = plain.get("items") or []
        return items

    def _call(self, what: str, request: Callable[[], object], *, name: str | None = None) -> Any:
        """The response as plain JSON data (the client returns dicts for custom objects)."""
        try:
            return request()
        except ApiException as error:
            raise CliError(self._explain(what, error, name)) from None
        except urllib3.exceptions.HTTPError as error:
            raise CliError(
                f"cannot reach the Kubernetes API server at {self.server} ({what}): "
                f"{_root_cause(error)}"
            ) from None

    def _explain(self, what: str, error: ApiException, name: str | None) -> str:
        message, details = _status_message(error)
        if error.status == HTTPStatus.NOT_FOUND:
            if name is not None and details.get("name") == name:
                return f"{KIND} {name!r} not found in namespace {self.namespace}"
            return (
                f"the {KIND} API ({PLURAL}.{GROUP}/{VERSION}) is not installed on "
                f"{self.server}; apply crds/stabletrainingjobs.yaml first"
            )
        if error.status == HTTPStatus.FORBIDDEN:
            return (
                f"permission denied: cannot {what}: {message}. Ask for a Role that grants "
                f"this verb on {PLURAL}.{GROUP}"
            )
        if error.status == HTTPStatus.CONFLICT:
            return f"cannot {what}: the job changed while this command ran; run it again"
        if error.status == HTTPStatus.UNAUTHORIZED:
            return f"the API server at {self.server} rejected the credentials: {message}"
        return f"cannot {what}: {error.status} {error.reason}: {message}"


def _status_message(error: ApiException) -> tuple[str, dict[str, Any]]:
    """The server's own sentence (a metav1.Status body) and its details, if it sent one."""
    try:
        body = json.loads(error.body or "")
    except ValueError:
        return (str(error.body or error.reason)).strip(), {}
    if not isinstance(body, dict):
        return str(body), {}
    details = body.get("details")
    return str(body.get("message", error.reason)), details if isinstance(details, dict) else {}


def _root_cause(error: BaseException) -> str:
    reason = getattr(error, "reason", None)
    while isinstance(reason, BaseException) and getattr(reason, "reason", None) is not None:
        reason = getattr(reason, "reason", None)
    cause = reason if isinstance(reason, BaseException) else error
    text = str(cause)
    marker = "Failed to establish a new connection: "
    return text.split(marker, 1)[1].rstrip("')\"") if marker in text else text
