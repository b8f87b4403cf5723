"""A container's environment and argv, resolved the way the kubelet resolves them.

Order and precedence follow the kubelet: `envFrom` sources first, then `env` entries (later
ones win), and `$(VAR)` references in values, command and args expand to variables defined
earlier (`$$` escapes a literal `$`; unknown references stay as written).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from support.localnode.api import Json, RawApi
from support.localnode.sources import PodConfigError, field_value, read_source

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def expand(text: str, known: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return known[name] if name in known else match.group(0)

    return _REFERENCE.sub(substitute, text)


def _value_from(api: RawApi, pod: Json, source: Json) -> str | None:
    namespace = pod["metadata"]["namespace"]
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"])
    for field, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
        if field in source:
            ref: dict[str, Any] = source[field]
            optional = bool(ref.get("optional", False))
            data = read_source(api, kind, namespace, ref["name"], optional)
            if ref["key"] not in data:
                if optional:
                    return None
                raise PodConfigError(f"couldn't find key {ref['key']} in {kind} {ref['name']}")
            return data[ref["key"]].decode()
    raise PodConfigError(f"valueFrom {sorted(source)} is not supported by the local node")


def container_env(
    api: RawApi, pod: Json, container: Json, defaults: Mapping[str, str]
) -> dict[str, str]:
    """The environment the container's process starts with."""
    namespace = pod["metadata"]["namespace"]
    env = dict(defaults)
    for source in container.get("envFrom") or []:
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        ref: dict[str, Any] = source.get("configMapRef") or source.get("secretRef") or {}
        data = read_source(api, kind, namespace, ref["name"], bool(ref.get("optional", False)))
        prefix = source.get("prefix", "")
        for key, raw in data.items():
            if _ENV_NAME.match(prefix + key):
                env[prefix + key] = raw.decode()
    for variable in container.get("env") or []:
        if "valueFrom" in variable:
            resolved = _value_from(api, pod, variable["valueFrom"])
            if resolved is None:
                continue
        else:
            resolved = expand(variable.get("value", ""), env)
        env[variable["name"]] = resolved
    return env


def container_argv(container: Json, env: Mapping[str, str]) -> list[str]:
    """command + args, expanded; there is no image, so there is no entrypoint to fall back on."""
    command = [expand(part, env) for part in container.get("command") or []]
    args = [expand(part, env) for part in container.get("args") or []]
    if not command:
        raise PodConfigError(
            f"container {container['name']}: `command` is required on the local node "
            "(there is no image whose entrypoint could run)"
        )
    return command + args
