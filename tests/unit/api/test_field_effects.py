"""The field table of docs/api.md (generate/field_effects.py) covers every spec field, names only
fields the schema has, and only tests that exist: no field the code may silently ignore."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from stabletrain_operator.api.cluster_policy import StableTrainingPolicy
from stabletrain_operator.api.resource import StableTrainingJob
from stabletrain_operator.generate.field_effects import FIELD_EFFECTS, POLICY_FIELD_EFFECTS
from stabletrain_operator.generate.schema import structural

REPO = Path(__file__).resolve().parents[3]


def spec_paths(node: dict[str, Any], path: str) -> list[str]:
    """Every field path docs/api.md's field reference lists under spec."""
    found = [path]
    children = node.get("properties") or node.get("items", {}).get("properties") or {}
    prefix = path + ("[]" if "items" in node else "")
    for name, child in children.items():
        found += spec_paths(child, f"{prefix}.{name}")
    return found


def test_every_spec_field_has_a_row_and_every_row_a_field() -> None:
    schema = structural(StableTrainingJob)
    fields = spec_paths(schema["properties"]["spec"], "spec")
    assert [f for f in fields if f not in FIELD_EFFECTS] == [], "fields without a row"
    assert [f for f in FIELD_EFFECTS if f not in fields] == [], "rows without a field"


def test_every_policy_field_has_a_row_and_every_row_a_field() -> None:
    """StableTrainingPolicy too; its defaults' nested fields are the job's own (above)."""
    schema = structural(StableTrainingPolicy)
    fields = [
        f
        for f in spec_paths(schema["properties"]["spec"], "spec")
        if not f.startswith(("spec.defaults.detection.", "spec.defaults.recovery."))
    ]
    assert [f for f in fields if f not in POLICY_FIELD_EFFECTS] == [], "fields without a row"
    assert [f for f in POLICY_FIELD_EFFECTS if f not in fields] == [], "rows without a field"


def test_every_row_names_where_and_existing_tests() -> None:
    missing = []
    for field, effect in {**FIELD_EFFECTS, **POLICY_FIELD_EFFECTS}.items():
        assert effect.where, field
        assert effect.tests, field
        for test in effect.tests:
            file, _, name = test.partition("::")
            source = REPO / file
            text = source.read_text() if source.is_file() else ""
            if not re.search(rf"^(async )?def {re.escape(name)}\(", text, re.MULTILINE):
                missing.append(f"{field}: {test}")
    assert missing == []
