"""Against the real API server: the Ready nodes a relaunch may keep away from, and the
optional remediation that taints or cordons a node once it lost the pods of several jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from stabletrain_operator.api.status import SuspectNode
from stabletrain_operator.apiserver import ApiServer
from stabletrain_operator.kube import Kube
from stabletrain_operator.reconcile import remediate
from stabletrain_operator.remediation import (
    REASON_ANNOTATION,
    TAINT_KEY,
    TAINT_VALUE,
    NodeAction,
    NodeRemediation,
    NodeVotes,
)
from support.localnode import LocalCluster

NOW = datetime.now(UTC)


def _lost(incidents: int) -> tuple[SuspectNode, ...]:
    """node-b as a job's suspect after `incidents` losses of its pods with the node."""
    node = SuspectNode(node="node-b", incidents=incidents, node_lost_incidents=incidents,
                       last_reason="pod gpt-a0-1 was lost before it finished",
                       last_incident_at=NOW, expires_at=NOW + timedelta(hours=1))  # fmt: skip
    return (node,)


def _our_taints(node: Any) -> list[tuple[str, str, str]]:
    """The remediation's taints only: kube-controller-manager's node lifecycle may still hold
    its own (node.kubernetes.io/not-ready) on a node that turned Ready a moment ago."""
    return [(t.key, t.value, t.effect) for t in node.spec.taints or [] if t.key == TAINT_KEY]


class CountingKube(Kube):
    """The real client, counting the remediation's writes to nodes: the node's own
    resourceVersion also moves with its kubelet's status and kube-controller-manager's taints."""

    patches = 0

    def patch_node(self, name: str, patch: Any) -> None:
        self.patches += 1
        super().patch_node(name, patch)


def test_ready_nodes_are_listed_and_a_node_two_jobs_lost_is_tainted_once_with_the_reason(
    api_client: client.ApiClient, operator_api: ApiServer, local_cluster: LocalCluster
) -> None:
    kube = CountingKube(operator_api)
    assert sorted(kube.schedulable_nodes() or []) == ["node-a", "node-b"]
    core: Any = client.CoreV1Api(api_client)
    rule = NodeRemediation(NodeAction.TAINT, 2)
    votes = NodeVotes()
    remediate(kube, rule, votes, votes.record("ml/gpt", _lost(2)), NOW)
    assert not _our_taints(core.read_node("node-b")), "two losses, but of one job"
    remediate(kube, rule, votes, votes.record("nlp/bert", _lost(1)), NOW)
    node = core.read_node("node-b")
    assert _our_taints(node) == [(TAINT_KEY, TAINT_VALUE, "NoSchedule")]
    assert node.metadata.annotations[REASON_ANNOTATION] == (
        "lost the pods of 2 job(s) (ml/gpt, nlp/bert) 3 time(s): "
        "pod gpt-a0-1 was lost before it finished"
    )
    written = kube.patches
    remediate(kube, rule, votes, votes.record("nlp/bert", _lost(2)), NOW)
    assert kube.patches == written, "tainted already: no second write"
    assert _our_taints(core.read_node("node-b")) == [(TAINT_KEY, TAINT_VALUE, "NoSchedule")]
    assert sorted(kube.schedulable_nodes() or []) == ["node-a", "node-b"], "tainted, not cordoned"
    cordon = NodeRemediation(NodeAction.CORDON, 2)
    remediate(kube, cordon, votes, votes.record("nlp/bert", _lost(3)), NOW)
    assert core.read_node("node-b").spec.unschedulable
    assert kube.schedulable_nodes() == ["node-a"]


class RacedKube(Kube):
    """The real client; other writers change the node right after each of its first reads:
    another controller taints it, then its kubelet's status and the node lifecycle move its
    resourceVersion again, as on a node that just registered."""

    races = 1
    raced = 0
    other: Any = None
    """Another controller's client (CoreV1Api)."""

    def node_taints(self, name: str) -> tuple[list[Any], str] | None:
        read = super().node_taints(name)
        if self.raced < self.races:
            self.raced += 1
            core = self.other
            if self.raced == 1:
                node = core.read_node(name)
                others = [*(node.spec.taints or []), {"key": "repair", "effect": "NoSchedule"}]
                core.patch_node(name, {"spec": {"taints": others}})
            else:
                core.patch_node(name, {"metadata": {"annotations": {"busy": str(self.raced)}}})
        return read


def test_a_taint_added_between_the_read_and_the_patch_is_kept(
    api_client: client.ApiClient, operator_api: ApiServer, local_cluster: LocalCluster
) -> None:
    """The taint list is replaced whole: at the version it was read, else read again (409),
    also when the node changes again under the second attempt."""
    kube = RacedKube(operator_api)
    kube.other = client.CoreV1Api(api_client)
    kube.races = 2
    votes = NodeVotes()
    rule = NodeRemediation(NodeAction.TAINT, 1, jobs=1)
    remediate(kube, rule, votes, votes.record("ml/race", _lost(1)), NOW)
    assert kube.raced == 2
    core: Any = client.CoreV1Api(api_client)
    keys = [t.key for t in core.read_node("node-b").spec.taints or []]
    assert "repair" in keys, keys
    assert TAINT_KEY in keys, keys
