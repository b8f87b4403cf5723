"""values.schema.json and helm lint: a typo or a wrong type fails the install with the key
named, before anything reaches a cluster. These run the real helm binary, no cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.chart import ALL_ON_VALUES, CHART, KUBE_VERSION, RenderError, helm, render

SCHEMA = json.loads((CHART / "values.schema.json").read_text())


@pytest.mark.parametrize(
    "values", [None, *ALL_ON_VALUES], ids=lambda v: v.name if v else "defaults"
)
def test_helm_lint_strict_passes(values: Path | None) -> None:
    args = ["-f", str(values)] if values else []
    done = helm("lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_helm_lint_strict_fails_on_a_values_file_with_an_unknown_key(tmp_path: Path) -> None:
    """The negative control of the lint runs above: lint does apply the schema."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("podMonitor:\n  enabled: true\n  intervall: 30s\n")
    done = helm("lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), "-f", str(bad))
    assert done.returncode != 0
    assert "additional properties 'intervall' not allowed" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("operator.replicas=two", "at '/operator/replicas': got string, want integer"),
        ("prometheusRule.enabled=yes", "at '/prometheusRule/enabled': got string, want boolean"),
        ("agent.port=70000", "at '/agent/port': maximum: got 70,000, want 65,535"),
        ("serviceMonitor.interval=30seconds", "at '/serviceMonitor/interval': '30seconds'"),
        ("watchNamespaces[0]=Team_A", "at '/watchNamespaces/0': 'Team_A' does not match"),
    ],
)
def test_schema_rejects_a_wrong_type_or_value_naming_the_key(assignment: str, message: str) -> None:
    with pytest.raises(RenderError) as error:
        render(sets=[assignment])
    assert "values don't meet the specifications of the schema" in str(error.value)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("assignment", "where", "key"),
    [
        ("bogus=1", "''", "bogus"),
        ("operator.replica=2", "'/operator'", "replica"),
        (
            "networkPolicy.prometheus.namespaceSelector.matchLabel.a=b",
            "'/networkPolicy/prometheus/namespaceSelector'",
            "matchLabel",
        ),
        ("operator.resources.request.cpu=1", "'/operator/resources'", "request"),
    ],
)
def test_schema_rejects_an_unknown_key_at_any_depth(assignment: str, where: str, key: str) -> None:
    with pytest.raises(RenderError) as error:
        render(sets=[assignment])
    assert f"at {where}: additional properties '{key}' not allowed" in str(error.value)


def test_several_replicas_without_peering_are_refused_with_the_fix_named() -> None:
    with pytest.raises(RenderError) as error:
        render(sets=["operator.replicas=2"])
    assert "operator.replicas > 1 needs operator.peering.enabled: true" in str(error.value)


def object_nodes(node: Any, path: str = "$") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node that declares properties, with its JSON path."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if "properties" in node:
            found.append((path, node))
        for key, child in node.items():
            found += object_nodes(child, f"{path}.{key}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += object_nodes(child, f"{path}[{index}]")
    return found


def test_every_object_in_the_schema_is_closed() -> None:
    nodes = object_nodes(SCHEMA)
    assert len(nodes) > 20
    open_nodes = [path for path, node in nodes if node.get("additionalProperties") is not False]
    assert open_nodes == []


def test_the_schema_describes_exactly_the_keys_of_values_yaml() -> None:
    """No key of values.yaml is missing from the schema, and every key of the chart's own
    objects has a default (Kubernetes objects passed through, such as affinity, need not)."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def keys(values: Any, schema: dict[str, Any], path: str) -> list[str]:
        problems: list[str] = []
        properties = schema.get("properties", {})
        if not isinstance(values, dict) or not properties:
            return problems
        if schema.get("description", "").startswith("Kubernetes "):
            return [f"{path}.{k} not in schema" for k in values if k not in properties]
        problems += [f"{path}.{k} not in schema" for k in values if k not in properties]
        problems += [f"{path}.{k} not in values.yaml" for k in properties if k not in values]
        for key, value in values.items():
            if key in properties:
                problems += keys(value, properties[key], f"{path}.{key}")
        return problems

    assert keys(defaults, SCHEMA, "") == []


def test_the_chart_crd_is_the_generated_crd() -> None:
    chart_crd = CHART / "crds" / "stabletrainingjobs.yaml"
    generated = CHART.parents[1] / "crds" / "stabletrainingjobs.yaml"
    assert chart_crd.read_bytes() == generated.read_bytes(), "run `make crds` and commit"
