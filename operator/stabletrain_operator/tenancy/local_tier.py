"""Whether the node-local tier a spec asks for is one the cluster allows (limits.py)."""

from __future__ import annotations

import posixpath

from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import LocalTierSpec, bad_directory
from stabletrain_operator.tenancy import pod_security
from stabletrain_operator.tenancy.limits import TenancySettings
from stabletrain_operator.tenancy.problems import SpecProblem

FIELD = "spec.checkpoints.local"


def _host_path_problem(path: str, settings: TenancySettings) -> SpecProblem | None:
    field = f"{FIELD}.hostPath"
    problem = bad_directory(path)
    if problem is not None:
        return SpecProblem(
            field, Reason.HOST_PATH_NOT_ALLOWED, f"{path!r} cannot be a node directory: {problem}"
        )
    if posixpath.normpath(path) in settings.host_path_prefixes:
        return None
    if not settings.host_path_prefixes:
        allowed = "this cluster allows no node directory; use spec.checkpoints.local.volume"
    else:
        allowed = (
            f"this cluster allows {', '.join(settings.host_path_prefixes)} (name one: the "
            "operator gives the job its own <prefix>/<namespace>/<job> below it)"
        )
    return SpecProblem(field, Reason.HOST_PATH_NOT_ALLOWED, f"{path!r} is not allowed: {allowed}")


def _volume_problems(volume: dict[str, object], settings: TenancySettings) -> list[SpecProblem]:
    field = f"{FIELD}.volume"
    keys = sorted(volume)
    if len(keys) != 1:
        return [
            SpecProblem(
                field,
                Reason.VOLUME_TYPE_NOT_ALLOWED,
                f"must hold exactly one volume source, not {', '.join(keys) or 'none'}",
            )
        ]
    kind = keys[0]
    if kind == "hostPath":
        return [
            SpecProblem(
                field,
                Reason.VOLUME_TYPE_NOT_ALLOWED,
                "a hostPath goes in spec.checkpoints.local.hostPath, where the "
                "cluster's node directories apply",
            )
        ]
    if kind not in settings.local_volume_types:
        allowed = ", ".join(sorted(settings.local_volume_types)) or "none"
        return [
            SpecProblem(
                field,
                Reason.VOLUME_TYPE_NOT_ALLOWED,
                f"volume type {kind} is not allowed here (this cluster allows: {allowed})",
            )
        ]
    pod = {"spec": {"volumes": [{"name": "local", **volume}]}}
    return [
        SpecProblem(
            field,
            Reason.POD_SECURITY,
            f"{found.message} ({settings.pod_security} Pod Security level)",
        )
        for found in pod_security.violations(pod, settings.pod_security)
    ]


def local_tier_problems(local: LocalTierSpec, settings: TenancySettings) -> list[SpecProblem]:
    if local.host_path is not None:
        problem = _host_path_problem(local.host_path, settings)
        return [] if problem is None else [problem]
    return _volume_problems(dict(local.volume or {}), settings)
