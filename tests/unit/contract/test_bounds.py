"""Every list and string the agent and the operator exchange has a bound (issue: one pod
must not make the shared operator hold an unbounded amount for it).

The bounds are read off the models' own JSON schemas, so a field added later without one
fails here, naming it.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from typing import Any

import stabletrain_contract
from stabletrain_contract.base import ContractModel


def contract_models() -> list[type[ContractModel]]:
    found: dict[str, type[ContractModel]] = {}
    for module_info in pkgutil.iter_modules(stabletrain_contract.__path__):
        module = importlib.import_module(f"stabletrain_contract.{module_info.name}")
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, ContractModel)
                and value.__module__ == module.__name__
            ):
                found[f"{module.__name__}.{name}"] = value
    return [found[name] for name in sorted(found)]


def unbounded(node: Any, path: str) -> Iterator[str]:
    """Paths of schema nodes that accept a string or an array of any length."""
    if isinstance(node, dict):
        kind = node.get("type")
        if kind == "string" and not (
            "maxLength" in node or "enum" in node or "const" in node or "format" in node
        ):
            yield f"{path}: string without maxLength"
        if kind == "array" and "maxItems" not in node:
            yield f"{path}: array without maxItems"
        for key, child in node.items():
            yield from unbounded(child, f"{path}.{key}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from unbounded(child, f"{path}[{index}]")


def test_the_walk_finds_every_model_of_the_contract() -> None:
    names = {model.__name__ for model in contract_models()}
    assert {"AgentStatus", "TripReport", "Directives", "DirectiveAck", "PreflightFacts"} <= names


def test_every_list_and_string_of_the_contract_is_bounded() -> None:
    problems = [
        problem
        for model in contract_models()
        for problem in unbounded(model.model_json_schema(), model.__name__)
    ]
    assert problems == []
