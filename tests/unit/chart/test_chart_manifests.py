"""What `helm template` renders: least-privilege RBAC, restricted pod security, probes that
point at kopf's liveness endpoint, the HA switch, the operator arguments behind every job's
NetworkPolicy and the tenancy limits, and alert and dashboard queries that name series the
agent really exports."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.endpoint.exporter import AgentExporter
from stabletrain_contract import env
from stabletrain_operator import metrics, naming, pods
from stabletrain_operator.remediation import NodeAction, NodeRemediation
from stabletrain_operator.tenancy.limits import PodSecurityLevel
from stabletrain_operator.tenancy.network_policy import NetworkSettings, build_network_policy
from support.chart import ALL_ON_VALUES, CHART, Manifest, Rendered, parse_promql, render

CLUSTER_ALL_ON, NAMESPACED_ALL_ON = ALL_ON_VALUES
VARIANTS = {
    "defaults": (),
    "cluster-all-on": (CLUSTER_ALL_ON,),
    "namespaced-all-on": (NAMESPACED_ALL_ON,),
}
RBAC_KINDS = ("ClusterRole", "Role")


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return render(values_files=VARIANTS[request.param])


def rules(rendered: Rendered) -> list[dict[str, Any]]:
    return [
        rule for kind in RBAC_KINDS for role in rendered.of_kind(kind) for rule in role["rules"]
    ]


def pod_spec(rendered: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = rendered.one("Deployment")["spec"]["template"]["spec"]
    return spec


def container(rendered: Rendered) -> dict[str, Any]:
    (operator,) = pod_spec(rendered)["containers"]
    found: dict[str, Any] = operator
    return found


# --- RBAC ---------------------------------------------------------------------------------


def test_rbac_has_no_wildcards(rendered: Rendered) -> None:
    found = rules(rendered)
    assert found
    for rule in found:
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(field, []), rule


def test_secrets_are_only_created_and_read_by_name(rendered: Rendered) -> None:
    """The live-directive token is the only Secret the operator deals with: it creates it
    and reads it back by name (kube.py's secret_value); it can never list or watch."""
    secret_rules = [r for r in rules(rendered) if "secrets" in r["resources"]]
    assert secret_rules
    for rule in secret_rules:
        assert rule["apiGroups"] == [""]
        assert rule["resources"] == ["secrets"]
        assert rule["verbs"] == ["get", "create"]


def test_every_rbac_rule_is_commented_with_its_reason(rendered: Rendered) -> None:
    lines = rendered.text.splitlines()
    rule_lines = [i for i, line in enumerate(lines) if line.lstrip().startswith("- apiGroups:")]
    assert len(rule_lines) == len(rules(rendered))
    uncommented = [lines[i] for i in rule_lines if not lines[i - 1].lstrip().startswith("#")]
    assert uncommented == []


POLICY_READS = [
    {"apiGroups": ["stabletrain.dev"], "resources": ["stabletrainingpolicies"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
]
"""The platform policies' read, a ClusterRole of its own in every install."""


def split_policy_reads(out: Rendered, kind: str) -> tuple[list[Manifest], list[Manifest]]:
    """The `kind` objects apart from the platform policies' ones, and those."""
    found = out.of_kind(kind)
    reads = [o for o in found if o["metadata"]["name"].endswith("-policies")]
    return [o for o in found if o not in reads], reads


def test_every_install_reads_the_platform_policies_and_nothing_more_cluster_wide() -> None:
    for values in ([], ["watchNamespaces={team-a}"]):
        out = render(sets=values)
        _, (role,) = split_policy_reads(out, "ClusterRole")
        _, (binding,) = split_policy_reads(out, "ClusterRoleBinding")
        assert role["rules"] == POLICY_READS
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"][0]["name"] == out.one("ServiceAccount")["metadata"]["name"]


def test_cluster_mode_is_one_cluster_role_bound_to_the_chart_service_account() -> None:
    out = render()
    assert out.of_kind("Role") == []
    assert out.of_kind("RoleBinding") == []
    (role,), _ = split_policy_reads(out, "ClusterRole")
    (binding,), _ = split_policy_reads(out, "ClusterRoleBinding")
    account = out.one("ServiceAccount")["metadata"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    crd_rules = [r for r in role["rules"] if r["apiGroups"] == ["apiextensions.k8s.io"]]
    assert crd_rules == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        }
    ]


def test_namespaced_mode_has_no_cluster_wide_permission_but_the_policies_read() -> None:
    out = render(sets=["watchNamespaces={team-a,team-b}"])
    assert split_policy_reads(out, "ClusterRole")[0] == []
    assert split_policy_reads(out, "ClusterRoleBinding")[0] == []
    assert sorted(r["metadata"]["namespace"] for r in out.of_kind("Role")) == ["team-a", "team-b"]
    for binding in out.of_kind("RoleBinding"):
        assert binding["subjects"][0]["namespace"] == "stabletrain-system"
    args = container(out)["args"]
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    assert not any(a.startswith("--namespace") for a in container(render())["args"])


def test_peering_objects_are_patched_only_by_name() -> None:
    for values in ALL_ON_VALUES:
        out = render(values_files=(values,))
        peering_rules = [r for r in rules(out) if r["apiGroups"] == ["kopf.dev"]]
        writes = [r for r in peering_rules if "patch" in r["verbs"]]
        assert writes
        peering_names = {p["metadata"]["name"] for p in out.hooks()}
        for rule in writes:
            assert set(rule["resourceNames"]) == peering_names


# --- the Deployment -----------------------------------------------------------------------


def test_restricted_pod_security(rendered: Rendered) -> None:
    pod = pod_spec(rendered)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container(rendered)["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert all("hostPath" not in volume for volume in pod["volumes"])


def test_probes_reach_the_kopf_liveness_endpoint(rendered: Rendered) -> None:
    operator = container(rendered)
    ports = {port["name"]: port["containerPort"] for port in operator["ports"]}
    (liveness,) = [a for a in operator["args"] if a.startswith("--liveness=")]
    for probe in (operator["livenessProbe"], operator["readinessProbe"]):
        http = probe["httpGet"]
        assert liveness == f"--liveness=http://0.0.0.0:{ports[http['port']]}{http['path']}"


def test_metrics_service_targets_the_metrics_port(rendered: Rendered) -> None:
    service = rendered.one("Service")
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container(rendered)["ports"]}
    template_labels = rendered.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= template_labels.items()


def test_one_replica_recreates_and_runs_standalone() -> None:
    deployment = render().one("Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    operator = deployment["spec"]["template"]["spec"]["containers"][0]
    assert operator["command"] == ["python", "-m", "stabletrain_operator"]
    assert not any(a.startswith(("--peering", "--priority")) for a in operator["args"])


def test_ha_replicas_peer_under_a_random_priority() -> None:
    out = render(values_files=(CLUSTER_ALL_ON,))
    deployment = out.one("Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    operator = deployment["spec"]["template"]["spec"]["containers"][0]
    (peering,) = [a for a in operator["args"] if a.startswith("--peering=")]
    (hook,) = out.hooks()
    assert hook["kind"] == "ClusterKopfPeering"
    assert peering == f"--peering={hook['metadata']['name']}"
    assert operator["command"][:2] == ["/bin/sh", "-c"]
    assert operator["command"][2].startswith('exec python -m stabletrain_operator "$@" --priority=')
    assert out.one("PodDisruptionBudget")["spec"]["minAvailable"] == 1
    crd = out.one("CustomResourceDefinition")
    assert crd["metadata"]["name"] == "clusterkopfpeerings.kopf.dev"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_namespaced_ha_peers_in_every_watched_namespace() -> None:
    out = render(values_files=(NAMESPACED_ALL_ON,))
    hooks = out.hooks()
    assert sorted((h["kind"], h["metadata"]["namespace"]) for h in hooks) == [
        ("KopfPeering", "team-a"),
        ("KopfPeering", "team-b"),
    ]
    assert out.one("CustomResourceDefinition")["spec"]["scope"] == "Namespaced"


# --- Each job's NetworkPolicy, made by the operator from the chart's arguments -----------

JOB = pods.JobRef("gpt", "team-a", "uid-1")


def job_policy(out: Rendered, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The NetworkPolicy the operator the chart configures gives a job."""
    args = parse_operator_args(operator_argv(out), monkeypatch)
    assert args.network_policy is True
    settings = NetworkSettings(
        enabled=args.network_policy,
        agent_peers=args.agent_peers,
        extra_ingress=args.network_policy_extra_ingress,
    )
    return build_network_policy(JOB, args.agent_port, settings)


def test_every_job_gets_a_policy_whose_agent_port_admits_the_operator_and_prometheus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = render(values_files=(CLUSTER_ALL_ON,))
    assert out.of_kind("NetworkPolicy") == [], "no namespace-wide policy: each job has its own"
    workers_rule, agent_rule, extra = job_policy(out, monkeypatch)["spec"]["ingress"]
    assert agent_rule["ports"] == [{"protocol": "TCP", "port": env.DEFAULT_AGENT_PORT}]
    operator_peer, prometheus_peer = agent_rule["from"]
    operator_labels = out.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert operator_peer["podSelector"]["matchLabels"].items() <= operator_labels.items()
    assert operator_peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "stabletrain-system"}
    }
    assert prometheus_peer["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "prometheus"}
    }
    assert workers_rule["from"] == [{"podSelector": {"matchLabels": {naming.JOB_LABEL: "gpt"}}}]
    assert workers_rule["ports"] == [
        {"protocol": "TCP", "port": 1, "endPort": env.DEFAULT_AGENT_PORT - 1},
        {"protocol": "TCP", "port": env.DEFAULT_AGENT_PORT + 1, "endPort": 65535},
    ]
    assert extra["ports"] == [{"port": 6006, "protocol": "TCP"}]


def test_by_default_only_the_operator_reaches_the_agent_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = render()
    _, agent_rule = job_policy(out, monkeypatch)["spec"]["ingress"]
    (operator_peer,) = agent_rule["from"]
    assert operator_peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "stabletrain-system"
    }
    granted = {(g, r) for rule in rules(out) for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("networking.k8s.io", "networkpolicies") in granted


def test_without_job_policies_the_operator_makes_none_and_may_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = render(sets=["networkPolicy.enabled=false"])
    assert parse_operator_args(operator_argv(out), monkeypatch).network_policy is False
    assert all("networkpolicies" not in rule["resources"] for rule in rules(out))


def test_agent_selector_uses_the_operators_job_label() -> None:
    out = render(values_files=(NAMESPACED_ALL_ON,))
    expected = {"matchExpressions": [{"key": naming.JOB_LABEL, "operator": "Exists"}]}
    monitor = out.one("PodMonitor")
    assert monitor["spec"]["selector"] == expected
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["portNumber"] == env.DEFAULT_AGENT_PORT


def test_agent_port_reaches_the_operator_and_the_monitoring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = render(values_files=(CLUSTER_ALL_ON,), sets=["agent.port=9555"])
    assert parse_operator_args(operator_argv(out), monkeypatch).agent_port == 9555
    (endpoint,) = out.one("PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["portNumber"] == 9555
    _, agent_rule, _ = job_policy(out, monkeypatch)["spec"]["ingress"]
    assert agent_rule["ports"] == [{"protocol": "TCP", "port": 9555}]


def test_the_tenancy_values_reach_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = parse_operator_args(operator_argv(render()), monkeypatch)
    assert defaults.host_path_prefixes == ("/var/lib/stabletrain",)
    assert defaults.local_volume_types == {"emptyDir", "ephemeral", "persistentVolumeClaim"}
    assert defaults.pod_security is PodSecurityLevel.BASELINE
    args = parse_operator_args(operator_argv(render(values_files=(CLUSTER_ALL_ON,))), monkeypatch)
    assert args.host_path_prefixes == ("/mnt/nvme0", "/mnt/nvme1")
    assert args.local_volume_types == {"emptyDir", "ephemeral", "csi"}
    assert args.pod_security is PodSecurityLevel.RESTRICTED
    assert args.remediate_nodes == NodeRemediation(NodeAction.CORDON, 4)
    assert args.remediate_min_jobs == 3
    none = render(sets=["tenancy.hostPathPrefixes=null", "tenancy.localVolumeTypes=null"])
    nothing = parse_operator_args(operator_argv(none), monkeypatch)
    assert (nothing.host_path_prefixes, nothing.local_volume_types) == ((), frozenset())


def test_every_value_is_read_by_a_template() -> None:
    """Nothing in values.yaml is decorative: each key, or a map above it that a template
    renders whole (toYaml), is read by a template."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    templates = "\n".join(p.read_text() for p in (CHART / "templates").iterdir())

    def read(path: str) -> bool:
        return re.search(re.escape(path) + r"(?![A-Za-z0-9_])", templates) is not None

    def unread(node: Any, path: str) -> list[str]:
        if read(path):
            return []
        if isinstance(node, dict) and node:
            return [key for name, value in node.items() for key in unread(value, f"{path}.{name}")]
        return [path]

    assert [key for name, value in values.items() for key in unread(value, f".Values.{name}")] == []


# --- alerts and dashboard name real series ------------------------------------------------

SERIES = re.compile(r"\bstabletrain_[a-z0-9_]+")
JOB_SERIES_LABEL = "stabletrain_job"
"""The label the PodMonitor's relabeling gives agent series; queries group by it."""
JOB_NAMESPACE_LABEL = "stabletrain_namespace"
"""The job's namespace on the operator's per-job budget gauge (metrics.BUDGET_REMAINING)."""


def agent_series() -> set[str]:
    exporter = AgentExporter(source=DirectiveSource(attempt=0), token="t", node="n", node_rank=0)
    return exposed(exporter.registry)


def queried_series() -> set[str]:
    out = render(values_files=(CLUSTER_ALL_ON,))
    rule = out.one("PrometheusRule")
    exprs = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    dashboard = json.loads((CHART / "dashboards" / "stabletrain-jobs.json").read_text())
    exprs += [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    labels = {JOB_SERIES_LABEL, JOB_NAMESPACE_LABEL}
    return {name for expr in exprs for name in SERIES.findall(expr)} - labels


def test_agent_series_get_the_job_label_the_queries_use() -> None:
    out = render(values_files=(CLUSTER_ALL_ON,))
    (endpoint,) = out.one("PodMonitor")["spec"]["podMetricsEndpoints"]
    (relabel,) = endpoint["relabelings"]
    assert relabel["targetLabel"] == JOB_SERIES_LABEL
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_stabletrain_dev_job"]


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exposed(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry can expose, also for label sets not incremented yet."""
    return {
        family.name + suffix for family in registry.collect() for suffix in SUFFIXES[family.type]
    }


def test_operator_series_in_alerts_and_dashboard_exist() -> None:
    names = {n for n in queried_series() if n.startswith("stabletrain_operator_")}
    assert "stabletrain_operator_rollbacks_total" in names
    missing = names - exposed(metrics.REGISTRY)
    assert missing == set(), f"not exported by the operator: {sorted(missing)}"


def test_agent_series_in_alerts_and_dashboard_exist() -> None:
    names = {n for n in queried_series() if not n.startswith("stabletrain_operator_")}
    assert {"stabletrain_loss", "stabletrain_tokens_per_second"} <= names
    missing = names - agent_series()
    assert missing == set(), f"not exported by the agent: {sorted(missing)}"


OPERATIONS_DOC = CHART.parents[1] / "docs" / "operations.md"


def test_alert_decisions_page_people_through_the_documented_route() -> None:
    """Before: stabletrain_operator_alerts_total counted Alert decisions and no rule read it.
    After: StableTrainingJobAlerted fires on it, and the Alertmanager route in
    docs/operations.md names only alerts the chart ships."""
    rule = render(values_files=(CLUSTER_ALL_ON,)).one("PrometheusRule")
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    alerted = alerts["StableTrainingJobAlerted"]
    assert "stabletrain_operator_alerts_total" in alerted["expr"]
    assert alerted["labels"]["team"] == "ml-platform", "prometheusRule.alertLabels reach it"
    blocks = re.findall(r"```yaml\n(.*?)```", OPERATIONS_DOC.read_text(), re.DOTALL)
    (route,) = [yaml.safe_load(b) for b in blocks if b.startswith("route:")]
    routed = {
        name
        for sub in route["route"]["routes"]
        for matcher in sub["matchers"]
        if matcher.startswith("alertname")
        for name in matcher.split("=", 1)[1].lstrip("~").strip('"').split("|")
    }
    assert "StableTrainingJobAlerted" in routed
    assert routed <= set(alerts), f"routes name alerts the chart lacks: {routed - set(alerts)}"
    receivers = {r["name"] for r in route["receivers"]}
    assert {sub["receiver"] for sub in route["route"]["routes"]} <= receivers


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    dashboard: Manifest = json.loads((CHART / "dashboards" / "stabletrain-jobs.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for t in panel["targets"]
        for name in SERIES.findall(t["expr"])
    }
    for series in (
        "stabletrain_loss",
        "stabletrain_loss_baseline",
        "stabletrain_grad_norm",
        "stabletrain_learning_rate",
        "stabletrain_tokens_per_second",
    ):
        assert series in queried
    (rollbacks,) = [a for a in dashboard["annotations"]["list"] if a.get("name") == "Rollbacks"]
    assert "stabletrain_operator_rollbacks_total" in rollbacks["expr"]


def test_dashboard_file_is_what_the_config_map_carries() -> None:
    out = render(sets=["grafanaDashboard.enabled=true"])
    (config_map,) = [
        c for c in out.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-dashboard")
    ]
    path = Path(CHART / "dashboards" / "stabletrain-jobs.json")
    assert json.loads(config_map["data"]["stabletrain-jobs.json"]) == json.loads(path.read_text())


GRAFANA_VARIABLES = {"$namespace": "ml", "$job": ".*"}


def all_expressions() -> list[str]:
    """Every PromQL expression the chart ships, Grafana's variables filled in."""
    rule = render(values_files=(CLUSTER_ALL_ON,)).one("PrometheusRule")
    exprs = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    dashboard = json.loads((CHART / "dashboards" / "stabletrain-jobs.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    queries += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    for variable, value in GRAFANA_VARIABLES.items():
        queries = [q.replace(variable, value) for q in queries]
    return exprs + queries


def test_every_promql_expression_parses_with_prometheus_own_parser() -> None:
    expressions = all_expressions()
    assert len(expressions) >= 15
    checked = parse_promql(expressions)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_promql_check_refuses_a_broken_expression() -> None:
    checked = parse_promql(["up == 0", "sum by (signal) (rate(x[5m]) > 0"])
    assert checked.returncode == 1
    assert checked.stdout.startswith("1: ")
    assert "parse error" in checked.stdout


def operator_argv(out: Rendered) -> list[str]:
    """The arguments the operator's entry point receives from the chart's container."""
    operator = container(out)
    if operator["command"][:2] == ["/bin/sh", "-c"]:
        return [*operator["args"], "--priority=12345"]
    assert operator["command"] == ["python", "-m", "stabletrain_operator"]
    return list(operator["args"])


def parse_operator_args(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The operator's own argument parser (stabletrain_operator.__main__) over `argv`."""
    entry = importlib.import_module("stabletrain_operator.__main__")
    monkeypatch.setattr(sys, "argv", ["stabletrain-operator", *argv])
    return entry._arguments()


def test_the_operator_accepts_the_charts_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    out = render(sets=["watchNamespaces={team-a,team-b}", "operator.verbose=true"])
    args = parse_operator_args(operator_argv(out), monkeypatch)
    assert args.namespace == ["team-a", "team-b"]
    assert args.metrics_port == container(out)["ports"][0]["containerPort"]
    assert args.agent_port == env.DEFAULT_AGENT_PORT
    assert args.liveness == "http://0.0.0.0:8080/healthz"
    assert args.peering is None
    assert args.verbose is True


def test_the_operator_accepts_the_ha_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    out = render(values_files=(CLUSTER_ALL_ON,))
    args = parse_operator_args(operator_argv(out), monkeypatch)
    assert args.peering == "st-stabletrain"
    assert args.priority == 12345


def test_every_failed_job_pages_not_only_a_fail_decision() -> None:
    """Before: StableTrainingJobFailed read the Fail decisions, and a job that ended Failed
    with no decision (NoUsableCheckpoint) paged nobody."""
    rule = render(values_files=(CLUSTER_ALL_ON,)).one("PrometheusRule")
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    failed = alerts["StableTrainingJobFailed"]
    assert "stabletrain_operator_jobs_failed_total" in failed["expr"]
    assert "decisions_total" not in failed["expr"]
    assert failed["labels"]["severity"] == "critical"
