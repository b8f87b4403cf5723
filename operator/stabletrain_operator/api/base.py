"""Model configuration and schema helpers shared by the spec and status models."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict

from stabletrain_contract.base import ContractModel


class ApiModel(ContractModel):
    """The contract's model configuration (camelCase on the wire, unknown fields rejected,
    attribute docstrings as descriptions), with two differences.

    Mutable: the operator builds a status by copying and updating, and the spec and status
    are its own objects, not payloads shared with the agent. NaN and infinity serialise as
    null (pydantic's default), not as strings: the API server's schema has nullable numbers
    and no string where a number belongs.

    `extra="forbid"` mirrors what the API server does with strict field validation, so the
    operator refuses the same objects the server would (and tests can use either).
    """

    model_config = ConfigDict(frozen=False, ser_json_inf_nan="null")
    __hash__: ClassVar[None] = None  # type: ignore[assignment]
    """Unhashable like any mutable model; without this, the frozen base's hash is inherited."""


PRESERVE_UNKNOWN: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
"""Schema of an embedded Kubernetes object we pass through unchanged (pod template, volume)."""
