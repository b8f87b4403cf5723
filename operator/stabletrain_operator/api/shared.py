"""Equal policy parts of different jobs are one object in the operator.

Most jobs of a fleet run the same detection, recovery and checkpoint policy (the built-in
defaults, or one platform policy), and the operator held a validated copy of it per job,
twice: in the spec and in `status.policy`. Summed object by object, those parts were 35 of
the 38 KiB of a job's parsed spec and most of the 29 KiB of its status.policy. A field
annotated `Shared()` validates a JSON input once and hands every later equal input the
same model instance.

The result of a validation depends on the input, the model and whether the input is read
as written (contract.base.AS_WRITTEN); those three are the key. Nothing else in the
validation context changes these models. The operator never changes a held model in place
(it makes changed copies; an attribute assignment on a held model fails, see
shared_field_names.py), so one instance can stand for every job with that policy. At most
SHARED_MAX inputs are remembered, the oldest forgotten first: a fleet with more distinct
policies shares less, and nothing else changes.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler, ValidationInfo, ValidatorFunctionWrapHandler
from pydantic_core import core_schema

from stabletrain_contract.base import as_written

SHARED_MAX = 512
"""Distinct inputs remembered (of every shared type together)."""

_validated: dict[tuple[object, ...], Any] = {}
_lock = threading.Lock()


def _key(source: object, value: object, info: ValidationInfo) -> tuple[object, ...] | None:
    """None for an input that is not plain JSON (a model, a datetime): validated as it is."""
    if not isinstance(value, dict):
        return None
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    return (source, as_written(info), info.mode, text)


def _validate_shared(
    source: object, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
) -> Any:
    key = _key(source, value, info)
    if key is None:
        return handler(value)
    with _lock:
        found = _validated.get(key)
    if found is not None:
        return found
    made = handler(value)  # a ValidationError is raised, never remembered
    with _lock:
        if len(_validated) >= SHARED_MAX:
            del _validated[next(iter(_validated))]
        return _validated.setdefault(key, made)


@dataclass(frozen=True)
class Shared:
    """`Annotated[SomeModel, Shared()]`: equal JSON inputs give one instance. The JSON
    schema (the CRD) is the model's own."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def validate(value: Any, inner: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
            return _validate_shared(source, value, inner, info)

        return core_schema.with_info_wrap_validator_function(validate, handler(source))


def remembered() -> int:
    """How many distinct inputs are remembered (for tests)."""
    return len(_validated)
