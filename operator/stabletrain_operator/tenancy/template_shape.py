"""The shape of the worker template's fields that the operator reads or fills in.

The CRD keeps the template open (any PodTemplateSpec, unknown fields kept), so the API
server accepts `env: "oops"` or tolerations as a map. pods.build_pod merges its own entries
into those fields and raised on such a template, on every tick. These checks name the
field instead; everything else in the template is the API server's to judge (a dry run of
the pod before the launch, tenancy/spec_check.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from stabletrain_operator.api.constants import Reason
from stabletrain_operator.api.spec import WorkersSpec
from stabletrain_operator.tenancy.problems import SpecProblem

FIELD = "spec.workers.template"
CONTAINER_LISTS = ("env", "volumeMounts", "ports")
"""Lists of a container the operator adds its own entries to."""


def _kind(value: object) -> str:
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"[:80]


def _problem(field: str, expected: str, value: object) -> SpecProblem:
    return SpecProblem(
        f"{FIELD}.{field}", Reason.MALFORMED_TEMPLATE, f"must be {expected}, not {_kind(value)}"
    )


def _string_map(value: object, field: str) -> Iterator[SpecProblem]:
    if value is None:
        return
    if not isinstance(value, Mapping):
        yield _problem(field, "a map of strings", value)
        return
    for key, item in value.items():
        if not isinstance(item, str):
            yield _problem(f"{field}[{key}]", "a string", item)


def _object_list(value: object, field: str, *, named: bool = False) -> Iterator[SpecProblem]:
    """A list of objects (each with a string `name` when `named`); absent is fine."""
    if value is None:
        return
    if not isinstance(value, list):
        yield _problem(field, "a list of objects", value)
        return
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            yield _problem(f"{field}[{index}]", "an object", item)
        elif named and not isinstance(item.get("name"), str):
            yield _problem(f"{field}[{index}].name", "a string", item.get("name"))


def _object(value: object, field: str) -> Iterator[SpecProblem]:
    if value is not None and not isinstance(value, Mapping):
        yield _problem(field, "an object", value)


def _affinity(spec: Mapping[str, Any]) -> Iterator[SpecProblem]:
    affinity = spec.get("affinity")
    yield from _object(affinity, "spec.affinity")
    if not isinstance(affinity, Mapping):
        return
    node = affinity.get("nodeAffinity")
    yield from _object(node, "spec.affinity.nodeAffinity")
    if not isinstance(node, Mapping):
        return
    base = "spec.affinity.nodeAffinity"
    preferred = "preferredDuringSchedulingIgnoredDuringExecution"
    yield from _object_list(node.get(preferred), f"{base}.{preferred}")
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    selector = node.get(required)
    yield from _object(selector, f"{base}.{required}")
    if not isinstance(selector, Mapping):
        return
    terms = selector.get("nodeSelectorTerms")
    yield from _object_list(terms, f"{base}.{required}.nodeSelectorTerms")
    for index, term in enumerate(terms if isinstance(terms, list) else []):
        if isinstance(term, Mapping):
            field = f"{base}.{required}.nodeSelectorTerms[{index}].matchFields"
            yield from _object_list(term.get("matchFields"), field)


def _containers(workers: WorkersSpec, spec: Mapping[str, Any]) -> Iterator[SpecProblem]:
    containers = spec.get("containers")
    yield from _object_list(containers, "spec.containers", named=True)
    if not isinstance(containers, list):
        return
    for index, container in enumerate(containers):
        if not isinstance(container, Mapping):
            continue
        for key in CONTAINER_LISTS:
            field = f"spec.containers[{index}].{key}"
            yield from _object_list(container.get(key), field, named=key == "env")
    names = [c.get("name") for c in containers if isinstance(c, Mapping)]
    if workers.container_name is not None and workers.container_name not in names:
        listed = ", ".join(str(n) for n in names)
        yield SpecProblem(
            "spec.workers.containerName",
            Reason.MALFORMED_TEMPLATE,
            f"{workers.container_name!r} names no container of the template ({listed})",
        )


def shape_problems(workers: WorkersSpec) -> list[SpecProblem]:
    """Every field of the template the operator fills in that has the wrong shape."""
    template = workers.template
    problems = list(_object(template.get("metadata"), "metadata"))
    metadata = template.get("metadata")
    if isinstance(metadata, Mapping):
        problems += _string_map(metadata.get("labels"), "metadata.labels")
        problems += _string_map(metadata.get("annotations"), "metadata.annotations")
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        return [*problems, _problem("spec", "a PodSpec object", spec)]
    problems += _containers(workers, spec)
    problems += _object_list(spec.get("volumes"), "spec.volumes", named=True)
    problems += _object_list(spec.get("tolerations"), "spec.tolerations")
    problems += _affinity(spec)
    return problems
