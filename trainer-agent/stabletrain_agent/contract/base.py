"""The one pydantic configuration every contract model shares.

camelCase on the wire because the same models are embedded in the Kubernetes resource,
whose conventions are camelCase; snake_case in Python. Unknown fields are errors, never
ignored: a misspelt threshold silently falling back to a default is how runs get lost.
Attribute docstrings become the field descriptions of the CRD and of docs/api.md.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel


class ContractModel(BaseModel):
    """Base of all agent<->operator schemas."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        frozen=True,
        ser_json_inf_nan="strings",
        use_attribute_docstrings=True,
    )


def kubernetes_rules(*rules: tuple[str, str, str]) -> dict[str, Any]:
    """CEL rules `(rule, message, fieldPath)` for the CRD that embeds a model.

    They repeat a model validator in the API server's language, so a manifest is refused at
    `kubectl apply` with the field named instead of later by the operator. An empty
    fieldPath means the object the rule sits on.
    """
    entries = []
    for rule, message, path in rules:
        entry = {"rule": rule, "message": message}
        if path:
            entry["fieldPath"] = path
        entries.append(entry)
    return {"x-kubernetes-validations": entries}


class ContractError(ValueError):
    """A payload crossing the agent<->operator boundary did not match its schema."""


def describe_errors(what: str, error: ValidationError) -> str:
    """One line per problem, each naming the field path as it appears on the wire."""
    lines = [f"invalid {what}:"]
    for problem in error.errors():
        location = ".".join(str(part) for part in problem["loc"]) or "(root)"
        lines.append(f"  {location}: {problem['msg']}")
    return "\n".join(lines)
