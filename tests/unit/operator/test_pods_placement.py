"""Relaunched pods keep away from suspect nodes, judged by the local node's own scheduler."""

from __future__ import annotations

from typing import Any

from operator_builders import spec

from stabletrain_operator import pods
from support.localnode.scheduler import choose_node

JOB = pods.JobRef("gpt", "team", "uid-1")


def _node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


NODES = [_node(n) for n in ("node-a", "node-b", "node-c")]


def test_required_avoidance_never_lands_on_a_suspect_even_when_it_was_the_previous_node() -> None:
    pod = pods.build_pod(spec(), JOB, 1, 1, "node-b", avoid_nodes=("node-b",), avoid_required=True)
    assert choose_node(pod, NODES, {"node-a": 1}) == ("node-c", "")
    alone = [_node("node-b")]
    chosen, why = choose_node(pod, alone, {})
    assert chosen is None
    assert "required node affinity" in why


def test_required_avoidance_is_added_to_each_term_the_template_requires() -> None:
    template = {
        "spec": {
            "containers": [{"name": "trainer", "command": ["torchrun"]}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In",
                     "values": ["node-a", "node-b"]}]}]}}},
        }
    }  # fmt: skip
    job = spec(workers={"nodes": 2, "template": template})
    pod = pods.build_pod(job, JOB, 1, 0, None, avoid_nodes=("node-a",), avoid_required=True)
    assert choose_node(pod, NODES, {}) == ("node-b", ""), "both the template's and ours hold"


def test_preferred_avoidance_outweighs_the_previous_node_but_uses_it_when_alone() -> None:
    pod = pods.build_pod(spec(), JOB, 1, 1, "node-b", avoid_nodes=("node-b",))
    chosen, _ = choose_node(pod, NODES[:2], {"node-a": 1})
    assert chosen == "node-a"
    assert choose_node(pod, [_node("node-b")], {}) == ("node-b", "")


def test_a_failed_container_leaves_its_log_tail_as_the_termination_message() -> None:
    (container,) = pods.build_pod(spec(), JOB, 0, 0)["spec"]["containers"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
