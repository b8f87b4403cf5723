"""The committed CRD, its chart copy and docs/api.md are exactly what the models generate,
and the generated schema is one the API server accepts as structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from stabletrain_contract.names import Action
from stabletrain_operator.generate.api_docs import env_docs
from stabletrain_operator.generate.crds import (
    CHART_CRD_PATH,
    CRD_PATH,
    DOCS_PATH,
    INHERITED,
    crd,
    main,
    openapi_schema,
    policy_openapi_schema,
    stale_files,
)
from stabletrain_operator.generate.schema import structural
from stabletrain_operator.policy.action_registry import kind_of

REPO = Path(__file__).resolve().parents[3]


def test_committed_files_match_a_fresh_generation() -> None:
    assert stale_files(REPO) == [], "run `make crds` and commit the result"


def test_check_mode_reports_a_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--root", str(tmp_path)]) == 0
    assert main(["--root", str(tmp_path), "--check"]) == 0
    (tmp_path / DOCS_PATH).write_text("edited by hand\n", encoding="utf-8")
    assert main(["--root", str(tmp_path), "--check"]) == 1
    assert f"stale: {DOCS_PATH}" in capsys.readouterr().err
    assert (tmp_path / CRD_PATH).read_text() == (tmp_path / CHART_CRD_PATH).read_text()


def nodes(schema: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, child in schema.get("properties", {}).items():
        found += nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found += nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        found += nodes(schema["additionalProperties"], f"{path}.*")
    return found


def test_schema_follows_the_structural_rules() -> None:
    for path, node in nodes(openapi_schema()):
        assert "$ref" not in node, path
        assert "const" not in node, path
        assert "uniqueItems" not in node, path
        assert not ("properties" in node and "additionalProperties" in node), path
        assert "anyOf" not in node or node.get("x-kubernetes-int-or-string"), path
        assert (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), path
        assert not isinstance(node.get("exclusiveMinimum"), int | float) or isinstance(
            node["exclusiveMinimum"], bool
        ), path


def test_parents_of_defaulted_fields_default_to_empty_objects() -> None:
    spec = openapi_schema()["properties"]["spec"]["properties"]
    assert spec["workers"]["properties"]["rendezvous"]["default"] == {}
    assert spec["checkpoints"]["properties"]["local"]["properties"]["retention"]["default"] == 3
    status = openapi_schema()["properties"]["status"]["properties"]
    detection = status["policy"]["properties"]["detection"]["properties"]
    assert detection["gradNormSpike"]["properties"]["ratio"]["default"] == 4.0


def test_what_a_job_inherits_carries_no_default_so_what_it_leaves_out_stays_out() -> None:
    """The API server stores only what the job sets in detection and recovery: the operator
    fills the rest from the job's StableTrainingPolicy defaults, then the built-in ones."""
    spec = openapi_schema()["properties"]["spec"]["properties"]
    for name in INHERITED:
        assert [path for path, node in nodes(spec[name], name) if "default" in node] == []
    defaults = policy_openapi_schema()["properties"]["spec"]["properties"]["defaults"]
    assert [path for path, node in nodes(defaults) if "default" in node] == []
    documented = (REPO / DOCS_PATH).read_text()
    assert "| `spec.recovery.budgets.maxRollbacks` | integer | `5` |" in documented, (
        "the reference still shows the built-in default"
    )


def test_identity_columns_and_subresource() -> None:
    definition = crd()
    names = definition["spec"]["names"]
    assert (names["kind"], names["shortNames"]) == ("StableTrainingJob", ["stj"])
    assert "stabletrain" in names["categories"]
    version = definition["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert columns == [
        "State", "Queue", "Unschedulable", "Step", "Loss", "LR Scale", "Rollbacks", "Age",
    ]  # fmt: skip


def test_rules_and_conditions_are_list_maps() -> None:
    schema = openapi_schema()["properties"]
    rules = schema["spec"]["properties"]["recovery"]["properties"]["rules"]
    conditions = schema["status"]["properties"]["conditions"]
    for listing, key in ((rules, "name"), (conditions, "type")):
        assert listing["x-kubernetes-list-type"] == "map"
        assert listing["x-kubernetes-list-map-keys"] == [key]
        assert key in listing["items"]["required"]


def test_every_cel_rule_names_a_field_or_its_object() -> None:
    rules = [
        (path, rule)
        for path, node in nodes(openapi_schema())
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 6
    for path, rule in rules:
        assert rule["message"], path
        assert rule.get("fieldPath", ".").startswith("."), path


def test_unions_are_refused_rather_than_emitted() -> None:
    class Ambiguous(BaseModel):
        value: int | str

    with pytest.raises(ValueError, match="union of several types is not structural"):
        structural(Ambiguous)


def test_every_action_has_its_documented_behaviour() -> None:
    docs = (REPO / DOCS_PATH).read_text()
    for action in Action:
        assert f"### {action.value}\n\n{kind_of(action).doc}\n" in docs


def test_every_field_is_described() -> None:
    schema = openapi_schema()["properties"]
    undocumented = [
        path
        for top in ("spec", "status")
        for path, node in nodes(schema[top], top)
        if not path.endswith("[]") and not node.get("description")
    ]
    assert undocumented == []


def test_every_environment_variable_is_documented() -> None:
    documented = env_docs()
    assert "STABLETRAIN_ATTEMPT" in documented
    assert [name for name, doc in documented.items() if not doc] == []
