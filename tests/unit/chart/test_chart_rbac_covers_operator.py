"""The chart's RBAC against the operator's source: every Kubernetes API call the operator
makes and every kopf handler's watch is granted by the rendered Role, and nothing more.

Every request of the operator names a declared Resource and verb (apiserver.Resource, the
tables in kube.py and queue/api.py), and an undeclared verb is refused before it is sent,
so those tables are the complete list. A new call without its declaration fails wherever it
runs; with it but without its rule, it fails here, long before a cluster refuses it with 403.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from stabletrain_operator import kube
from stabletrain_operator.api.constants import GROUP, PLURAL
from stabletrain_operator.apiserver import ApiServer, Resource
from stabletrain_operator.queue import api as kueue_api
from stabletrain_operator.queue import workload as kueue
from support.chart import render

OPERATOR = Path(__file__).resolve().parents[3] / "operator" / "stabletrain_operator"
KUEUE_NAMES = {
    "KUEUE_GROUP": kueue.KUEUE_GROUP,
    "WORKLOADS": kueue.WORKLOADS,
    "RESOURCE_FLAVORS": kueue.RESOURCE_FLAVORS,
    "WORKLOAD_PRIORITY_CLASSES": kueue.WORKLOAD_PRIORITY_CLASSES,
}
"""Names kopf's Kueue handlers pass as group and plural (handlers/workloads.py)."""
NODE_PERMISSIONS_BY_INSTALL = {
    ("", "nodes", "list"): "cluster-wide installs only (namespaced ones only prefer to avoid)",
    ("", "nodes", "get"): "nodeRemediation.enabled only",
    ("", "nodes", "patch"): "nodeRemediation.enabled only",
}
"""Cluster-scoped calls the operator makes only where the install allows them; each is
checked against its values below instead of in every install."""
KOPF_HANDLER_NEEDS = {"daemon": ("list", "watch", "patch"), "index": ("list", "watch")}
"""What a kopf handler of that kind does with its resource: watch it (after a list), and
for a daemon also patch it (progress annotations, the finalizer)."""

Permission = tuple[str, str, str]  # (apiGroup, resource, verb)


def operator_sources() -> list[Path]:
    return [p for p in OPERATOR.rglob("*.py") if "cli" not in p.relative_to(OPERATOR).parts]


def permissions(resources: tuple[Resource, ...]) -> set[Permission]:
    return {(r.group, r.rbac_resource, verb) for r in resources for verb in r.verbs}


def api_calls() -> set[Permission]:
    return permissions(kube.RESOURCES + kueue_api.KUEUE_RESOURCES)


def test_every_request_goes_through_a_declared_resource() -> None:
    """Only apiserver.py sends a request of its own (ApiServer.request); everything else
    calls ApiServer.call with a Resource, so the tables above are complete."""
    senders = [
        path.relative_to(OPERATOR).as_posix()
        for path in operator_sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "request"
        and isinstance(node.ctx, ast.Load) and path.name != "apiserver.py"
    ]  # fmt: skip
    assert senders == []


def test_an_undeclared_verb_is_refused_before_it_is_sent() -> None:
    """The negative control: a verb outside a Resource's declaration never reaches the
    server (the ApiServer here has no connection at all)."""
    api = ApiServer.__new__(ApiServer)
    with pytest.raises(ValueError, match="delete on secrets is not declared"):
        api.call("delete", kube.SECRETS, namespace="ml", name="token")
    assert ("", "secrets", "get") in api_calls()
    assert ("networking.k8s.io", "networkpolicies", "update") in api_calls()
    assert (GROUP, f"{PLURAL}/status", "patch") in api_calls()
    assert ("", "pods", "list") in kopf_watches()


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
