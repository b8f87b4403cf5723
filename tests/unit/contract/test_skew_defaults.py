"""The directives' defaults never change (docs/operations.md, "Version skew").

The operator leaves every field at its default out of the directives, so that an older agent
reads them; the older agent then applies its own default. That is the operator's intent only
while both defaults are one value. Compared here with the schemas recorded from older agents
(tests/support/skew_record.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stabletrain_contract.directives import Directives

SKEW = Path(__file__).parents[2] / "integration" / "skew"

CHANGED_BEFORE_THE_RULE = {"detection.stallSeconds": (900, None)}
"""Defaults that changed before the rule was written, with why that is harmless: the stall
bound is judged by the operator alone; no agent reads it."""


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """`path -> value` of every leaf of a JSON document (lists are leaves)."""
    if not isinstance(value, dict):
        return {prefix: value}
    found: dict[str, Any] = {}
    for key, item in value.items():
        found.update(flat(item, f"{prefix}.{key}" if prefix else key))
    return found


@pytest.mark.parametrize("agent", sorted(p.name for p in SKEW.glob("agent-*")))
def test_no_default_of_an_older_agent_changed(agent: str) -> None:
    older = flat(json.loads((SKEW / agent / "directives-defaults.json").read_text()))
    today = flat(Directives(generation=1, attempt=0).model_dump(mode="json", by_alias=True))
    changed = {
        key: (older[key], today[key])
        for key in older.keys() & today.keys()
        if older[key] != today[key]
    }
    assert changed.keys() <= CHANGED_BEFORE_THE_RULE.keys()
    assert all(changed[key] == CHANGED_BEFORE_THE_RULE[key] for key in changed)
    assert older.keys() <= today.keys(), "a field was removed"
