"""The local node's pure rules, without a cluster: scheduling, $(VAR) expansion, cluster-DNS
names, pod phase and the atomic volume writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.localnode.api import Json
from support.localnode.container import Exit
from support.localnode.env import expand
from support.localnode.hosts import Endpoint, headless_endpoints, hosts_text
from support.localnode.projection import current_files, write_files
from support.localnode.scheduler import choose_node
from support.localnode.status import ContainerView, pod_phase


def _node(name: str, ready: bool = True, taints: list[Json] | None = None, **labels: str) -> Json:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {"taints": taints or []},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def _pod(**spec: object) -> Json:
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [], **spec}}


NODES = [_node("a"), _node("b", disk="nvme")]


def test_scheduler_spreads_then_honours_selectors_taints_and_preferences() -> None:
    assert choose_node(_pod(), NODES, {"a": 2, "b": 0})[0] == "b"
    assert choose_node(_pod(nodeSelector={"disk": "nvme"}), NODES, {"b": 9})[0] == "b"
    prefer_a = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["a"]}]}}]}}  # fmt: skip
    assert choose_node(_pod(affinity=prefer_a), NODES, {"a": 5, "b": 0})[0] == "a"
    tainted = [_node("a", taints=[{"key": "node.kubernetes.io/unreachable",
                                   "effect": "NoExecute"}]), _node("b", ready=False)]  # fmt: skip
    chosen, why = choose_node(_pod(), tainted, {})
    assert chosen is None
    assert "a: untolerated taint node.kubernetes.io/unreachable" in why
    assert "b: node is not Ready" in why
    tolerant = _pod(tolerations=[{"operator": "Exists"}])
    assert choose_node(tolerant, tainted, {})[0] == "a"


def test_required_node_affinity_filters() -> None:
    only_b = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "disk", "operator": "Exists"}]}]}}}  # fmt: skip
    assert choose_node(_pod(affinity=only_b), NODES, {"b": 100})[0] == "b"


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("--local-addr=$(POD_IP)", "--local-addr=10.0.0.7"),
        ("$(UNKNOWN) stays", "$(UNKNOWN) stays"),
        ("$$(POD_IP) is escaped", "$(POD_IP) is escaped"),
        ("$(POD_IP):$(PORT)", "10.0.0.7:29500"),
    ],
)
def test_kubernetes_variable_expansion(text: str, expanded: str) -> None:
    assert expand(text, {"POD_IP": "10.0.0.7", "PORT": "29500"}) == expanded


def test_hosts_file_names_pods_of_headless_services_with_search_path_forms() -> None:
    slices: list[Json] = [
        {"metadata": {"namespace": "ns", "labels": {"kubernetes.io/service-name": "job",
                                                    "service.kubernetes.io/headless": ""}},
         "endpoints": [{"addresses": ["10.1.0.2"], "hostname": "job-0"},
                       {"addresses": ["10.1.0.3"], "hostname": "job-1",
                        "conditions": {"ready": False}}]},
        {"metadata": {"namespace": "ns", "labels": {"kubernetes.io/service-name": "web"}},
         "endpoints": [{"addresses": ["10.1.0.9"], "hostname": "web-0"}]},
    ]  # fmt: skip
    endpoints = headless_endpoints(slices)
    assert endpoints == [Endpoint("ns", "job", "10.1.0.2", "job-0")]
    here = hosts_text(_pod(hostname="job-1", subdomain="job"), "10.1.0.3", endpoints)
    assert "10.1.0.3\tjob-1.job.ns.svc.cluster.local\tjob-1\n" in here
    assert (
        "10.1.0.2\tjob-0.job.ns.svc.cluster.local job-0.job.ns.svc job-0.job.ns job-0.job\n" in here
    )
    elsewhere = {"metadata": {"name": "q", "namespace": "other"}, "spec": {}}
    there = hosts_text(elsewhere, "10.1.0.4", endpoints)
    assert "job-0.job.ns.svc.cluster.local job-0.job.ns.svc job-0.job.ns\n" in there
    assert " job-0.job\n" not in there


def _exit(code: int) -> Exit:
    return Exit(code, "Completed" if code == 0 else "Error", "", "t0", "t1")


def test_pod_phase_follows_exits_and_pending_restarts() -> None:
    assert pod_phase([ContainerView("c", "")]) == "Pending"
    assert pod_phase([ContainerView("c", "", running_since="t")]) == "Running"
    assert pod_phase([ContainerView("c", "", exits=[_exit(0)], runs=1)]) == "Succeeded"
    assert pod_phase([ContainerView("c", "", exits=[_exit(1)], runs=1)]) == "Failed"
    restarting = ContainerView("c", "", exits=[_exit(1)], runs=1, restarts_pending=True)
    assert pod_phase([restarting]) == "Running"


def test_volume_writer_swaps_whole_sets_and_refuses_escaping_paths(tmp_path: Path) -> None:
    target = tmp_path / "config"
    assert write_files(target, {"a": (b"1", 0o644), "dir/b": (b"2", 0o600)})
    assert (target / "a").read_bytes() == b"1"
    assert (target / "dir" / "b").read_bytes() == b"2"
    assert not write_files(target, current_files(target))
    assert write_files(target, {"a": (b"new", 0o644)})
    assert (target / "a").read_bytes() == b"new"
    assert not (target / "dir").exists()
    timestamped = [p for p in target.iterdir() if p.name.startswith("..") and not p.is_symlink()]
    assert len(timestamped) == 1
    with pytest.raises(ValueError, match="must be relative"):
        write_files(target, {"../escape": (b"x", 0o644)})
