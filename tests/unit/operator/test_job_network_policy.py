"""Every job's own NetworkPolicy: the agent port for the named peers only, every other TCP
port for the job's own pods only; and the ownership test the operator applies to the
objects it finds under its names."""

from __future__ import annotations

from typing import Any

import pytest

from stabletrain_operator import naming, pods
from stabletrain_operator.api.constants import Reason
from stabletrain_operator.ownership import NotOwnedError, controller_uid, owned_by
from stabletrain_operator.tenancy.network_policy import (
    NetworkSettings,
    build_network_policy,
    parse_ingress,
    parse_peers,
)

JOB = pods.JobRef("gpt", "team", "uid-1")
OPERATOR = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "stabletrain-system"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "stabletrain"}},
}


def rules_for(policy: dict[str, Any], port: int) -> list[dict[str, Any]]:
    """The ingress rules that let TCP connections to `port` in."""
    return [
        rule
        for rule in policy["spec"]["ingress"]
        if any(
            p["protocol"] == "TCP" and p["port"] <= port <= p.get("endPort", p["port"])
            for p in rule["ports"]
        )
    ]


def test_the_agent_port_is_open_to_the_named_peers_and_nothing_else() -> None:
    policy = build_network_policy(JOB, 9400, NetworkSettings(agent_peers=(OPERATOR,)))
    assert policy["metadata"]["name"] == "gpt-network"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    own = {"matchLabels": {naming.JOB_LABEL: "gpt"}}
    assert policy["spec"]["podSelector"] == own
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert [rule["from"] for rule in rules_for(policy, 9400)] == [[OPERATOR]]
    for port in (1, 29400, 9399, 9401, 65535):
        assert [rule["from"] for rule in rules_for(policy, port)] == [[{"podSelector": own}]]


def test_without_peers_nobody_reaches_the_agent_port() -> None:
    policy = build_network_policy(JOB, 9400, NetworkSettings())
    assert rules_for(policy, 9400) == []


def test_the_port_ranges_hold_at_the_edges() -> None:
    policy = build_network_policy(JOB, 1, NetworkSettings())
    assert policy["spec"]["ingress"][0]["ports"] == [
        {"protocol": "TCP", "port": 2, "endPort": 65535}
    ]
    policy = build_network_policy(JOB, 65535, NetworkSettings())
    assert policy["spec"]["ingress"][0]["ports"] == [
        {"protocol": "TCP", "port": 1, "endPort": 65534}
    ]


def test_extra_ingress_is_added_and_the_flags_name_a_bad_value() -> None:
    extra = {"from": [{"podSelector": {"matchLabels": {"app": "tensorboard"}}}],
             "ports": [{"protocol": "TCP", "port": 6006}]}  # fmt: skip
    policy = build_network_policy(JOB, 9400, NetworkSettings(extra_ingress=(extra,)))
    assert policy["spec"]["ingress"][-1] == extra
    assert parse_peers('[{"ipBlock": {"cidr": "10.0.0.0/8"}}]') == (
        {"ipBlock": {"cidr": "10.0.0.0/8"}},
    )
    assert parse_peers("") == ()
    with pytest.raises(ValueError, match="unknown key"):
        parse_peers('[{"podSelectr": {}}]')
    with pytest.raises(ValueError, match="not JSON"):
        parse_ingress("[{")
    with pytest.raises(ValueError, match="list of objects"):
        parse_ingress('{"from": []}')


def test_ownership_is_the_controller_uid_not_the_name() -> None:
    mine = {"metadata": JOB.metadata("gpt-a0-0")}
    assert controller_uid(mine["metadata"]) == "uid-1"
    assert owned_by(mine, "uid-1")
    labelled_only = {"metadata": {"name": "gpt-a0-0", "labels": {naming.JOB_LABEL: "gpt"}}}
    assert not owned_by(labelled_only, "uid-1")
    earlier = {"metadata": pods.JobRef("gpt", "team", "uid-0").metadata("gpt-token")}
    error = NotOwnedError("Secret", "gpt-token", "team",
                          earlier["metadata"]["ownerReferences"][0], "gpt")  # fmt: skip
    assert error.predecessor
    stranger = NotOwnedError("Secret", "gpt-token", "team", None, "gpt")
    assert not stranger.predecessor
    problem = stranger.problem()
    assert (problem.field, problem.reason) == ("metadata.name", Reason.NAME_TAKEN)
    assert "not controlled by a StableTrainingJob" in problem.message
