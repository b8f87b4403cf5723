"""One set of field names for all the held models that have the same ones.

pydantic gives every model instance its own `__pydantic_fields_set__`, the names of the
fields its input set: a set of five names or more is 728 bytes, often more than the values.
A job's daemon holds some seventy models (its spec, status, directives, each pod's heartbeat
and supervisor report), and at 1,000 jobs a census of the operator's objects counted 69,457
sets, 25 MiB, most of them these (bench/operator_scale.py, docs/operations.md "Memory").
The names repeat from job to job, so every held model with the same names points at one
set after each tick.

A shared set must never change in place, or every model pointing at it would change:
`SharedFieldNames` refuses each in-place change, and its copy is a plain set, which is what
pydantic's `model_copy` makes before it adds the updated names. The operator never assigns
to a model's attribute (the only in-place change pydantic makes to the set); if it ever
does to a held one, the assignment fails loudly instead of corrupting others.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn

from pydantic import BaseModel


class SharedFieldNames(set[str]):
    """Read-only in place; `copy.copy` gives a plain, mutable set."""

    def __copy__(self) -> set[str]:
        return set(self)

    def _refuse(self, *_: Any, **__: Any) -> NoReturn:
        raise TypeError("the field names of a held model are shared: copy the model to change it")

    add = discard = remove = pop = clear = update = _refuse
    intersection_update = difference_update = symmetric_difference_update = _refuse
    __ior__ = __iand__ = __isub__ = __ixor__ = _refuse


_shared: dict[frozenset[str], SharedFieldNames] = {}


def _shared_names(names: set[str]) -> SharedFieldNames:
    key = frozenset(names)
    found = _shared.get(key)
    if found is None:
        found = _shared[key] = SharedFieldNames(key)
    return found


def share_field_names(held: object) -> None:
    """Points every model reachable from `held` (through models, dataclasses, lists, tuples
    and dicts) at the shared set of its field names. A model already pointing at one is not
    entered again: what it holds was shared with it (models are copied, not changed)."""
    if isinstance(held, BaseModel):
        if type(held.__pydantic_fields_set__) is SharedFieldNames:
            return
        object.__setattr__(
            held, "__pydantic_fields_set__", _shared_names(held.__pydantic_fields_set__)
        )
        for value in held.__dict__.values():
            share_field_names(value)
    elif dataclasses.is_dataclass(held) and not isinstance(held, type):
        for field in dataclasses.fields(held):
            share_field_names(getattr(held, field.name))
    elif isinstance(held, dict):
        for value in held.values():
            share_field_names(value)
    elif isinstance(held, list | tuple):
        for value in held:
            share_field_names(value)
