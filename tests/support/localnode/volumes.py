"""A pod's volumes as directories on this machine, bind-mounted into its containers later.

The mapping stands in for a node's real storage: a hostPath is a directory under the node's own
directory (its "NVMe": pods on another node do not see it), every PersistentVolumeClaim is a
directory under one shared tree (the "PFS": all nodes see it), an emptyDir lives and dies with
the pod. ConfigMap, Secret, downward-API and projected volumes are rendered with the kubelet's
atomic-writer layout and re-rendered on every sync, so updates reach running containers; the
service-account token comes from the TokenRequest API and is renewed at 80% of its lifetime,
as a kubelet does.
"""

from __future__ import annotations

import datetime
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.localnode.api import Json, RawApi
from support.localnode.projection import Files, write_files
from support.localnode.sources import PodConfigError, field_value, read_source

DEFAULT_MODE = 0o644
TOKEN_RENEW_FRACTION = 0.8
RENDERED_KINDS = ("configMap", "secret", "downwardAPI", "projected")


@dataclass(frozen=True)
class Storage:
    """The disks of one node: its own (hostPath) and the shared one (claims)."""

    node_dir: Path
    shared_dir: Path

    def host_path(self, path: str) -> Path:
        return self.node_dir / "host" / path.lstrip("/")

    def claim(self, namespace: str, claim: str) -> Path:
        return self.shared_dir / namespace / claim


@dataclass
class _Token:
    value: bytes
    renew_at: float


def _items(
    data: dict[str, bytes], items: list[Json] | None, default_mode: int, what: str, optional: bool
) -> Files:
    if not items:
        return {key: (value, default_mode) for key, value in data.items()}
    files: Files = {}
    for item in items:
        key = item["key"]
        if key not in data:
            if optional:
                continue
            raise PodConfigError(f'{what}: key "{key}" not found')
        files[item["path"]] = (data[key], item.get("mode", default_mode))
    return files


class PodVolumes:
    """Resolves and keeps in sync the volumes of one pod."""

    def __init__(self, api: RawApi, storage: Storage, pod_dir: Path) -> None:
        self._api = api
        self._storage = storage
        self._volumes_dir = pod_dir / "volumes"
        self._tokens: dict[tuple[str, str], _Token] = {}
        self.paths: dict[str, Path] = {}

    def prepare(self, pod: Json) -> dict[str, Path]:
        """Every volume of the pod as a host directory (or file); raises while one is missing."""
        namespace = pod["metadata"]["namespace"]
        for volume in pod["spec"].get("volumes") or []:
            name = volume["name"]
            if name in self.paths:
                continue
            if "hostPath" in volume:
                path = self._host_path(volume["hostPath"])
            elif "persistentVolumeClaim" in volume:
                path = self._claim(namespace, volume["persistentVolumeClaim"]["claimName"])
            elif "emptyDir" in volume:
                path = self._volumes_dir / "empty-dir" / name
                path.mkdir(parents=True, exist_ok=True)
            elif any(kind in volume for kind in RENDERED_KINDS):
                path = self._volumes_dir / "rendered" / name
                write_files(path, self._render(pod, volume))
            else:
                kinds = sorted(set(volume) - {"name"})
                raise PodConfigError(f"volume {name}: type {kinds} is not supported")
            self.paths[name] = path
        return self.paths

    def sync(self, pod: Json) -> None:
        """Re-renders ConfigMap, Secret, downward-API and projected volumes that changed."""
        for volume in pod["spec"].get("volumes") or []:
            if volume["name"] in self.paths and any(k in volume for k in RENDERED_KINDS):
                write_files(self.paths[volume["name"]], self._render(pod, volume))

    def remove_pod_local(self) -> None:
        """emptyDirs and rendered volumes go with the pod; hostPath and claims stay."""
        shutil.rmtree(self._volumes_dir, ignore_errors=True)

    def _claim(self, namespace: str, claim: str) -> Path:
        """The claim must exist, as for a kubelet; binding and provisioning are not modelled."""
        if self._api.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}") is None:
            raise PodConfigError(f'persistentvolumeclaim "{claim}" not found')
        path = self._storage.claim(namespace, claim)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _host_path(self, source: Json) -> Path:
        path = self._storage.host_path(source["path"])
        kind = source.get("type") or ""
        if kind in ("", "DirectoryOrCreate"):
            path.mkdir(parents=True, exist_ok=True)
        elif kind == "FileOrCreate":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        elif kind == "Directory" and not path.is_dir():
            raise PodConfigError(f"hostPath {source['path']} is not a directory on this node")
        elif kind == "File" and not path.is_file():
            raise PodConfigError(f"hostPath {source['path']} is not a file on this node")
        elif kind not in ("Directory", "File"):
            raise PodConfigError(f"hostPath type {kind} is not supported by the local node")
        return path

    def _render(self, pod: Json, volume: Json) -> Files:
        namespace = pod["metadata"]["namespace"]
        if "configMap" in volume or "secret" in volume:
            return self._source_files(namespace, volume, DEFAULT_MODE)
        if "downwardAPI" in volume:
            source = volume["downwardAPI"]
            return self._downward(pod, source["items"], source.get("defaultMode", DEFAULT_MODE))
        projected = volume["projected"]
        mode = projected.get("defaultMode", DEFAULT_MODE)
        files: Files = {}
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                files[token["path"]] = (self._token(pod, token), 0o600)
            elif "downwardAPI" in source:
                files.update(self._downward(pod, source["downwardAPI"]["items"], mode))
            elif "configMap" in source or "secret" in source:
                files.update(self._source_files(namespace, source, mode))
            else:
                raise PodConfigError(f"projected source {sorted(source)} is not supported")
        return files

    def _source_files(self, namespace: str, volume: Json, default_mode: int) -> Files:
        kind = "ConfigMap" if "configMap" in volume else "Secret"
        source: dict[str, Any] = volume["configMap" if kind == "ConfigMap" else "secret"]
        name = source.get("name") or source.get("secretName") or ""
        optional = bool(source.get("optional", False))
        data = read_source(self._api, kind, namespace, name, optional)
        mode = source.get("defaultMode", default_mode)
        return _items(data, source.get("items"), mode, f'{kind.lower()} "{name}"', optional)

    def _downward(self, pod: Json, items: list[Json], default_mode: int) -> Files:
        files: Files = {}
        for item in items:
            if "fieldRef" not in item:
                raise PodConfigError(f"downwardAPI item {item['path']}: only fieldRef is supported")
            value = field_value(pod, item["fieldRef"]["fieldPath"]).encode()
            files[item["path"]] = (value, item.get("mode", default_mode))
        return files

    def _token(self, pod: Json, source: Json) -> bytes:
        audience = source.get("audience") or ""
        key = (audience, source["path"])
        cached = self._tokens.get(key)
        if cached is not None and time.time() < cached.renew_at:
            return cached.value
        metadata = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        spec: Json = {
            "expirationSeconds": source.get("expirationSeconds", 3600),
            "boundObjectRef": {
                "apiVersion": "v1", "kind": "Pod", "name": metadata["name"], "uid": metadata["uid"],
            },
        }  # fmt: skip
        if audience:
            spec["audiences"] = [audience]
        path = f"/api/v1/namespaces/{metadata['namespace']}/serviceaccounts/{account}/token"
        issued = time.time()
        answer = self._api.post(path, {"apiVersion": "authentication.k8s.io/v1", "spec": spec})
        expires = datetime.datetime.fromisoformat(
            answer["status"]["expirationTimestamp"].replace("Z", "+00:00")
        ).timestamp()
        token = _Token(answer["status"]["token"].encode(), 0.0)
        token.renew_at = issued + TOKEN_RENEW_FRACTION * (expires - issued)
        self._tokens[key] = token
        return token.value
