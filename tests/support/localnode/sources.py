"""Where a pod's configuration comes from: ConfigMaps, Secrets and the pod's own fields.

Shared by environment variables and volumes, which read the same objects the same way.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from support.localnode.api import Json, RawApi


class PodConfigError(RuntimeError):
    """The pod refers to something missing or unsupported; it waits with this message."""


def config_map_data(api: RawApi, namespace: str, name: str) -> dict[str, bytes] | None:
    found = api.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    if found is None:
        return None
    data = {key: value.encode() for key, value in (found.get("data") or {}).items()}
    for key, value in (found.get("binaryData") or {}).items():
        data[key] = base64.b64decode(value)
    return data


def secret_data(api: RawApi, namespace: str, name: str) -> dict[str, bytes] | None:
    found = api.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
    if found is None:
        return None
    return {key: base64.b64decode(value) for key, value in (found.get("data") or {}).items()}


def read_source(
    api: RawApi, kind: str, namespace: str, name: str, optional: bool
) -> dict[str, bytes]:
    """The data of a ConfigMap or Secret; an optional missing one reads as empty."""
    read = config_map_data if kind == "ConfigMap" else secret_data
    data = read(api, namespace, name)
    if data is None:
        if optional:
            return {}
        raise PodConfigError(f'{kind.lower()} "{name}" not found')
    return data


_LABEL_OR_ANNOTATION = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(pod: Json, field_path: str) -> str:
    """The downward API: a pod field by its fieldPath, as the kubelet resolves it."""
    metadata: dict[str, Any] = pod.get("metadata") or {}
    spec: dict[str, Any] = pod.get("spec") or {}
    status: dict[str, Any] = pod.get("status") or {}
    simple = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs") or []),
        "status.hostIPs": ",".join(ip["ip"] for ip in status.get("hostIPs") or []),
    }
    if field_path in simple:
        return str(simple[field_path])
    if field_path in ("metadata.labels", "metadata.annotations"):
        pairs = metadata.get(field_path.split(".")[1]) or {}
        return "\n".join(f'{key}="{value}"' for key, value in sorted(pairs.items()))
    match = _LABEL_OR_ANNOTATION.match(field_path)
    if match:
        return str((metadata.get(match.group(1)) or {}).get(match.group(2), ""))
    raise PodConfigError(f"fieldRef {field_path!r} is not supported by the local node")
