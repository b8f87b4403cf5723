"""The chart's RBAC against the operator's source: every Kubernetes API call the operator
makes (a `*_namespaced_*` method of the kubernetes client) and every kopf handler's watch
is granted by the rendered Role. A new call in the operator without its rule fails here,
long before a cluster refuses it with 403.

The mapping is the kubernetes client's naming: create/get/list/delete/patch keep their verb,
read is get, replace is update; `_status` is the status subresource.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from stabletrain_operator.api.cluster_policy import POLICY_PLURAL
from stabletrain_operator.api.constants import GROUP, PLURAL
from stabletrain_operator.queue import workload as kueue
from support.chart import render

OPERATOR = Path(__file__).resolve().parents[3] / "operator" / "stabletrain_operator"
CALL = re.compile(r"^(create|get|read|list|patch|replace|delete)_namespaced_(\w+?)(_status)?$")
NODE_CALL = re.compile(r"^(read|list|patch)_node$")
CLUSTER_CUSTOM_CALL = re.compile(r"^(get|list)_cluster_custom_object$")
PRIORITY_CLASS_CALL = re.compile(r"^(read|list)_priority_class$")
KUEUE_NAMES = {
    "KUEUE_GROUP": kueue.KUEUE_GROUP,
    "WORKLOADS": kueue.WORKLOADS,
    "RESOURCE_FLAVORS": kueue.RESOURCE_FLAVORS,
    "WORKLOAD_PRIORITY_CLASSES": kueue.WORKLOAD_PRIORITY_CLASSES,
}
"""Names the Kueue calls pass as group and plural (stabletrain_operator/queue)."""
NODE_PERMISSIONS_BY_INSTALL = {
    ("", "nodes", "list"): "cluster-wide installs only (namespaced ones only prefer to avoid)",
    ("", "nodes", "get"): "nodeRemediation.enabled only",
    ("", "nodes", "patch"): "nodeRemediation.enabled only",
}
"""Cluster-scoped calls the operator makes only where the install allows them; each is
checked against its values below instead of in every install."""
CLUSTER_CALLS = {
    "list_cluster_custom_object": (GROUP, POLICY_PLURAL, "list"),
    "read_namespace": ("", "namespaces", "get"),
}
"""Cluster-scoped calls every install makes: the platform policies and the labels of the
jobs' namespaces their selectors match (a ClusterRole of their own, namespaced installs too)."""
VERB = {"read": "get", "replace": "update"}
RESOURCES = {
    "pod": ("", "pods"),
    "service": ("", "services"),
    "config_map": ("", "configmaps"),
    "secret": ("", "secrets"),
    "event": ("", "events"),
    "network_policy": ("networking.k8s.io", "networkpolicies"),
}
KOPF_HANDLER_NEEDS = {"daemon": ("list", "watch", "patch"), "index": ("list", "watch")}
"""What a kopf handler of that kind does with its resource: watch it (after a list), and
for a daemon also patch it (progress annotations, the finalizer)."""

Permission = tuple[str, str, str]  # (apiGroup, resource, verb)


def operator_sources() -> list[Path]:
    return [p for p in OPERATOR.rglob("*.py") if "cli" not in p.relative_to(OPERATOR).parts]


def _kueue_name(node: ast.expr) -> str | None:
    return KUEUE_NAMES.get(node.id) if isinstance(node, ast.Name) else None


def _custom_object(call: ast.Call | None, plural_at: int) -> tuple[str, str]:
    """(group, plural) of a custom-objects call: Kueue's when its group is KUEUE_GROUP."""
    if call is not None and call.args and _kueue_name(call.args[0]) is not None:
        plural = _kueue_name(call.args[plural_at])
        assert plural is not None, ast.dump(call)
        return kueue.KUEUE_GROUP, plural
    return GROUP, PLURAL


def api_calls() -> set[Permission]:
    needed: set[Permission] = set()
    for path in operator_sources():
        tree = ast.parse(path.read_text())
        calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            if node.attr in CLUSTER_CALLS:
                needed.add(CLUSTER_CALLS[node.attr])
                continue
            node_call = NODE_CALL.match(node.attr)
            if node_call is not None:
                needed.add(("", "nodes", VERB.get(node_call.group(1), node_call.group(1))))
                continue
            priority_call = PRIORITY_CLASS_CALL.match(node.attr)
            if priority_call is not None:
                verb = VERB.get(priority_call.group(1), priority_call.group(1))
                needed.add(("scheduling.k8s.io", "priorityclasses", verb))
                continue
            cluster_call = CLUSTER_CUSTOM_CALL.match(node.attr)
            if cluster_call is not None:
                group, plural = _custom_object(calls.get(id(node)), 2)
                needed.add((group, plural, cluster_call.group(1)))
                continue
            match = CALL.match(node.attr)
            if match is None:
                continue
            action, resource, status = match.groups()
            verb = VERB.get(action, action)
            if resource == "custom_object":
                group, plural = _custom_object(calls.get(id(node)), 3)
                needed.add((group, plural + ("/status" if status else ""), verb))
            else:
                assert resource in RESOURCES, f"{path.name}: unmapped call {node.attr}"
                group, plural = RESOURCES[resource]
                needed.add((group, plural + ("/status" if status else ""), verb))
    return needed


def literal(node: ast.expr) -> str:
    """A handler decorator's argument: a string, or one of the api constants by name."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    names = {"GROUP": GROUP, "PLURAL": PLURAL, "VERSION": "v1alpha1", **KUEUE_NAMES}
    assert isinstance(node, ast.Name), ast.dump(node)
    return names.get(node.id, node.id)


def kopf_watches() -> set[Permission]:
    needed: set[Permission] = set()
    for path in operator_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if not (isinstance(owner, ast.Name) and owner.id == "kopf"):
                continue
            verbs = KOPF_HANDLER_NEEDS.get(node.func.attr)
            if verbs is None:
                continue
            group, _version, plural = (literal(arg) for arg in node.args[:3])
            needed |= {(group, plural, verb) for verb in verbs}
    return needed


def granted(values: list[str]) -> set[Permission]:
    rendered = render(sets=values)
    roles = [*rendered.of_kind("Role"), *rendered.of_kind("ClusterRole")]
    return {
        (group, resource, verb)
        for role in roles
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        if "resourceNames" not in rule
    }


def test_the_scan_finds_the_operators_calls() -> None:
    """The negative control: the scan is not vacuous."""
    calls = api_calls()
    assert ("", "secrets", "get") in calls
    assert ("networking.k8s.io", "networkpolicies", "update") in calls
    assert (GROUP, f"{PLURAL}/status", "patch") in calls
    assert ("", "pods", "list") in kopf_watches()


@pytest.mark.parametrize(
    "values", [[], ["watchNamespaces={team-a}"]], ids=["cluster", "namespaced"]
)
def test_every_operator_call_is_granted(values: list[str]) -> None:
    needed = (api_calls() | kopf_watches()) - set(NODE_PERMISSIONS_BY_INSTALL) - kueue_calls()
    missing = needed - granted(values)
    assert missing == set(), f"the operator calls these, the chart does not grant them: {missing}"


def test_node_permissions_follow_the_install() -> None:
    """nodes list for cluster-wide installs; get/patch only with nodeRemediation, in a
    ClusterRole of its own; nothing on nodes in a namespaced install without it."""
    assert set(NODE_PERMISSIONS_BY_INSTALL) <= api_calls(), "the operator makes these calls"
    nodes = {p for p in NODE_PERMISSIONS_BY_INSTALL}
    assert granted([]) & nodes == {("", "nodes", "list")}
    assert granted(["watchNamespaces={team-a}"]) & nodes == set()
    remediating = render(sets=["nodeRemediation.enabled=true"])
    (own,) = [r for r in remediating.of_kind("ClusterRole") if r["metadata"]["name"].endswith(
        "-node-remediation")]  # fmt: skip
    assert own["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    (args,) = [c["args"] for d in remediating.of_kind("Deployment")
               for c in d["spec"]["template"]["spec"]["containers"]]  # fmt: skip
    assert "--remediate-nodes=Taint:3" in args


def kueue_calls() -> set[Permission]:
    """What only the Kueue integration (queue/, handlers/workloads.py) calls."""
    return {
        p for p in api_calls() | kopf_watches()
        if p[0] in (kueue.KUEUE_GROUP, "scheduling.k8s.io")
    }  # fmt: skip


@pytest.mark.parametrize(
    "values",
    [["kueue.enabled=true"], ["kueue.enabled=true", "watchNamespaces={team-a}"]],
    ids=["cluster", "namespaced"],
)
def test_kueue_calls_are_granted_with_kueue_enabled_only(values: list[str]) -> None:
    calls = kueue_calls()
    assert (kueue.KUEUE_GROUP, "workloads/status", "patch") in calls, "the scan sees them"
    assert (kueue.KUEUE_GROUP, "resourceflavors", "get") in calls
    assert ("scheduling.k8s.io", "priorityclasses", "list") in calls
    assert (kueue.KUEUE_GROUP, "workloads", "watch") in calls
    assert calls - granted(values) == set()
    assert granted(values[1:]) & calls == set(), "nothing of Kueue without kueue.enabled"
    (args,) = [c["args"] for d in render(sets=values).of_kind("Deployment")
               for c in d["spec"]["template"]["spec"]["containers"]]  # fmt: skip
    assert "--kueue" in args


BEYOND_THE_CALLS = {
    (GROUP, f"{PLURAL}/finalizers", "update"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
}
"""Granted without a call in the source: blockOwnerDeletion on the children's owner
references (checked by the OwnerReferencesPermissionEnforcement admission plugin), and
kopf's CRD watch (cluster-wide installs)."""


@pytest.mark.parametrize(
    "values", [[], ["watchNamespaces={team-a}"]], ids=["cluster", "namespaced"]
)
def test_nothing_is_granted_that_the_operator_does_not_use(values: list[str]) -> None:
    extra = granted(values) - (api_calls() | kopf_watches())
    assert extra <= BEYOND_THE_CALLS, f"granted but never used: {extra - BEYOND_THE_CALLS}"
