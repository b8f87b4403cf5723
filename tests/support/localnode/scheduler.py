"""The smallest scheduler that gives pods the placement semantics the operator relies on.

Filters: the node is Ready and schedulable, its NoSchedule/NoExecute taints are tolerated,
`nodeName` (already bound) and `nodeSelector` match, and required node affinity holds.
Score: the summed weights of matching preferred node-affinity terms, which is how a pod asks to
go back to its previous node; ties go to the node with fewer pods, then by name. No resources,
no pod (anti-)affinity, no topology spread, no preemption.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from support.localnode.api import Json


def _requirement_holds(requirement: Json, values_of: Mapping[str, str]) -> bool:
    key, operator = requirement["key"], requirement["operator"]
    values = requirement.get("values") or []
    present = key in values_of
    if operator == "In":
        return present and values_of[key] in values
    if operator == "NotIn":
        return not present or values_of[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present:
        actual, bound = int(values_of[key]), int(values[0])
        return actual > bound if operator == "Gt" else actual < bound
    return False


def term_matches(term: Json, node: Json) -> bool:
    """A NodeSelectorTerm: all its expressions (labels) and fields (metadata.name) hold."""
    labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    expressions = term.get("matchExpressions") or []
    field_requirements = term.get("matchFields") or []
    if not expressions and not field_requirements:
        return False
    return all(_requirement_holds(r, labels) for r in expressions) and all(
        _requirement_holds(r, fields) for r in field_requirements
    )


def _tolerates(tolerations: Sequence[Json], taint: Json) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint["effect"]:
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint["key"]:
                return True
        elif toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get(
            "value", ""
        ):
            return True
    return False


def _ready(node: Json) -> bool:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition["type"] == "Ready":
            return bool(condition["status"] == "True")
    return False


def unfit_reason(pod: Json, node: Json) -> str | None:
    """Why the pod cannot go to this node, or None when it can."""
    spec = pod["spec"]
    if not _ready(node):
        return "node is not Ready"
    if (node.get("spec") or {}).get("unschedulable"):
        return "node is unschedulable"
    for taint in (node.get("spec") or {}).get("taints") or []:
        blocking = taint["effect"] in ("NoSchedule", "NoExecute")
        if blocking and not _tolerates(spec.get("tolerations") or [], taint):
            return f"untolerated taint {taint['key']}"
    labels = node["metadata"].get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required and not any(term_matches(t, node) for t in required["nodeSelectorTerms"]):
        return "required node affinity does not match"
    return None


def preference_score(pod: Json, node: Json) -> int:
    preferred = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution"
    ) or []
    return sum(p["weight"] for p in preferred if term_matches(p["preference"], node))


def choose_node(
    pod: Json, nodes: Sequence[Json], pods_per_node: Mapping[str, int]
) -> tuple[str | None, str]:
    """(node name, "") or (None, why no node fits)."""
    fitting = []
    reasons = []
    for node in nodes:
        reason = unfit_reason(pod, node)
        name = node["metadata"]["name"]
        if reason is None:
            fitting.append(node)
        else:
            reasons.append(f"{name}: {reason}")
    if not fitting:
        return None, f"0/{len(nodes)} nodes are available: " + "; ".join(sorted(reasons))
    best = min(
        fitting,
        key=lambda n: (
            -preference_score(pod, n),
            pods_per_node.get(n["metadata"]["name"], 0),
            n["metadata"]["name"],
        ),
    )
    return best["metadata"]["name"], ""
