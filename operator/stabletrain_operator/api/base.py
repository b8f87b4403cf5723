"""Model configuration and schema helpers shared by the spec and status models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """camelCase on the wire, unknown fields rejected, attribute docstrings as descriptions.

    `extra="forbid"` mirrors what the API server does with strict field validation, so the
    operator refuses the same objects the server would (and tests can use either).
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )


PRESERVE_UNKNOWN: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
"""Schema of an embedded Kubernetes object we pass through unchanged (pod template, volume)."""
