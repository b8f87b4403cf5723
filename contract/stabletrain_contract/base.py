"""The one pydantic configuration every contract model shares.

camelCase on the wire because the same models are embedded in the Kubernetes resource,
whose conventions are camelCase; snake_case in Python. Unknown fields are errors, never
ignored: a misspelt threshold silently falling back to a default is how runs get lost. The
one exception is what an agent reports to the operator (`AgentReport`): an agent may be a
release newer than the operator, and a field the operator does not know is something it
need not act on (docs/operations.md, "Version skew").
Attribute docstrings become the field descriptions of the CRD and of docs/api.md.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo
from pydantic.alias_generators import to_camel

AS_WRITTEN = "as_written"
"""Validation context key: an object as a person wrote it, before what it leaves out is
filled in from elsewhere (a StableTrainingPolicy's defaults): a check across its fields
waits for the merged object, which is validated in full."""


def as_written(info: ValidationInfo) -> bool:
    """Whether a validator runs on an object as written (see AS_WRITTEN)."""
    return info.context is not None and bool(info.context.get(AS_WRITTEN))


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


class AgentReport(ContractModel):
    """Base of what an agent sends the operator (status, trip report, preflight facts,
    acknowledgements): fields the reader does not know are ignored, not refused.

    An agent one optional field newer than its operator must still be read: a refused
    status would blind the operator to the whole job. Nothing the operator decides on is
    lost by it: a new field only ever adds what an older operator never acted on. What the
    operator tells an agent (directives) stays strict in the other direction.
    """

    model_config = ConfigDict(extra="ignore")


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
    return "\n".join([f"invalid {what}:", *(f"  {line}" for line in error_lines(error))])


def error_lines(error: ValidationError, *, under: str = "", root: str = "(root)") -> list[str]:
    """`path: message` for each problem of a validation, the one formatter of every package.

    The path is the field's as the payload spells it (camelCase for the contract's models),
    so the person who wrote the payload can find it; `under` prefixes it when the payload
    sits below a key of a larger document, and `root` names the payload itself when the
    problem is the whole of it.
    """
    lines = []
    for problem in error.errors():
        parts = (under, *problem["loc"]) if under else problem["loc"]
        location = ".".join(str(part) for part in parts) or root
        lines.append(f"{location}: {problem['msg']}")
    return lines
