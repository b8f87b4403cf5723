"""The chart against the real kube-apiserver: every rendered object, with defaults and with
every option on, passes a server-side dry-run with strict field validation, including the
ServiceMonitor, PodMonitor and PrometheusRule (their CRDs are prometheus-operator's own,
installed first, so the server validates them rather than skipping an unknown kind), and the
operator's pod is admitted by Pod Security admission at the `restricted` level.

Each check has its negative control: a broken object of the same kind is refused, so a
passing dry-run cannot come from validation that does not happen.
"""

from __future__ import annotations

import copy
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from support.chart import (
    ALL_ON_VALUES,
    CHART,
    Manifest,
    Rendered,
    dump,
    monitoring_crds,
    render,
)
from support.controlplane import ControlPlane

STABLETRAIN_CRD = CHART / "crds" / "stabletrainingjobs.yaml"
VARIANTS: dict[str, Sequence[Path]] = {
    "defaults": (),
    "cluster-all-on": (ALL_ON_VALUES[0],),
    "namespaced-all-on": (ALL_ON_VALUES[1],),
}


def kubectl(
    plane: ControlPlane, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        plane.kubectl(*args), input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


def wait_established(plane: ControlPlane, names: Sequence[str]) -> None:
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
    for name in names:
        deadline = time.monotonic() + 30
        while True:
            state = kubectl(plane, "get", "crd", name, "-o", f"jsonpath={jsonpath}")
            if state.stdout.strip() == "True":
                break
            assert time.monotonic() < deadline, f"CRD {name} not Established: {state.stderr}"
            time.sleep(0.2)


def apply_crds(plane: ControlPlane, text: str) -> None:
    applied = kubectl(plane, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=text)
    assert applied.returncode == 0, applied.stderr
    names = [doc["metadata"]["name"] for doc in yaml.safe_load_all(text) if doc]
    wait_established(plane, names)


@pytest.fixture(scope="module")
def crds_installed(control_plane: ControlPlane) -> list[str]:
    """prometheus-operator's monitoring CRDs, the stabletrain CRD and kopf's peering CRDs
    (as the chart renders them), installed for real: a dry-run cannot create a CRD first."""
    texts = [path.read_text() for path in monitoring_crds()]
    texts.append(STABLETRAIN_CRD.read_text())
    for values in ALL_ON_VALUES:
        texts.append(dump(render(values_files=(values,)).of_kind("CustomResourceDefinition")))
    names: list[str] = []
    for text in texts:
        apply_crds(control_plane, text)
        names += [doc["metadata"]["name"] for doc in yaml.safe_load_all(text) if doc]
    return names


@pytest.fixture
def namespaces(api_client: client.ApiClient) -> Iterator[list[str]]:
    """Three fresh namespaces: the release's and two watched ones."""
    core = client.CoreV1Api(api_client)
    names = [f"t-chart-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for name in names:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield names
    for name in names:
        core.delete_namespace(name)


def render_into(variant: str, namespaces: list[str]) -> Rendered:
    release_ns, *watched = namespaces
    sets = [f"watchNamespaces={{{','.join(watched)}}}"] if variant.startswith("namespaced") else []
    return render(values_files=VARIANTS[variant], sets=sets, namespace=release_ns)


def dry_run(plane: ControlPlane, manifests: Sequence[Manifest]) -> subprocess.CompletedProcess[str]:
    # kubectl's default --validate=strict makes the server refuse unknown or duplicate fields.
    return kubectl(plane, "apply", "--dry-run=server", "-f", "-", stdin=dump(manifests))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_object_passes_a_server_side_dry_run(
    control_plane: ControlPlane, crds_installed: list[str], namespaces: list[str], variant: str
) -> None:
    rendered = render_into(variant, namespaces)
    objects = [m for m in rendered.manifests if m["kind"] != "CustomResourceDefinition"]
    done = dry_run(control_plane, objects)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    accepted = [line for line in done.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(objects), done.stdout
    print(f"{variant}: {len(accepted)} objects accepted by a server-side dry-run:\n{done.stdout}")
    expected_kinds = {"Deployment", "ServiceAccount", "Service"}
    if variant != "defaults":
        expected_kinds |= {
            "ServiceMonitor",
            "PodMonitor",
            "PrometheusRule",
            "ConfigMap",
            "PodDisruptionBudget",
        }
    assert expected_kinds <= set(rendered.kinds())


def break_field(manifest: Manifest, path: Sequence[str | int], value: Any) -> Manifest:
    broken = copy.deepcopy(manifest)
    node: Any = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return broken


BROKEN = [
    ("ServiceMonitor", ("spec", "endpoints", 0, "scheme"), "ftp", "spec.endpoints[0].scheme"),
    ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "intervall"), "15s", "intervall"),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "for"), "ten minutes", "for"),
]


@pytest.mark.parametrize("case", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_object_of_each_optional_kind_is_refused(
    control_plane: ControlPlane,
    crds_installed: list[str],
    namespaces: list[str],
    case: tuple[str, Sequence[str | int], Any, str],
) -> None:
    """The negative control: the dry-run above validates these kinds for real."""
    kind, path, value, named = case
    rendered = render_into("cluster-all-on", namespaces)
    broken = break_field(rendered.of_kind(kind)[0], path, value)
    done = dry_run(control_plane, [broken])
    assert done.returncode != 0, done.stdout
    assert named in done.stderr, done.stderr
    print(f"broken {kind} refused: {done.stderr.strip()}")


def restricted_namespace(api_client: client.ApiClient) -> str:
    name = f"t-psa-{uuid.uuid4().hex[:8]}"
    labels = {
        f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn")
    } | {"pod-security.kubernetes.io/enforce-version": "latest"}
    client.CoreV1Api(api_client).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )
    return name


def operator_pod(rendered: Rendered, namespace: str) -> Manifest:
    template = rendered.one("Deployment")["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "operator-psa-check", "namespace": namespace, **template["metadata"]},
        "spec": template["spec"],
    }


@pytest.mark.parametrize("variant", ["defaults", "cluster-all-on"])
def test_operator_pod_is_admitted_at_pod_security_restricted(
    control_plane: ControlPlane, api_client: client.ApiClient, variant: str
) -> None:
    namespace = restricted_namespace(api_client)
    try:
        rendered = render(values_files=VARIANTS[variant], namespace=namespace)
        # The ServiceAccount admission plugin needs the account itself to exist.
        account = kubectl(
            control_plane, "apply", "-f", "-", stdin=dump(rendered.of_kind("ServiceAccount"))
        )
        assert account.returncode == 0, account.stderr
        pod = operator_pod(rendered, namespace)
        done = dry_run(control_plane, [pod])
        assert done.returncode == 0, done.stderr
        assert "violates PodSecurity" not in done.stderr
        # The Deployment passes the namespace's `warn` level too (no warning printed).
        deployment = dry_run(control_plane, [rendered.one("Deployment")])
        assert deployment.returncode == 0, deployment.stderr
        assert "Warning" not in deployment.stderr, deployment.stderr

        # Negative control: the same pod with privilege escalation allowed is refused.
        broken = break_field(
            pod, ("spec", "containers", 0, "securityContext", "allowPrivilegeEscalation"), True
        )
        refused = dry_run(control_plane, [broken])
        assert refused.returncode != 0
        assert 'violates PodSecurity "restricted:latest"' in refused.stderr
        assert "allowPrivilegeEscalation != false" in refused.stderr
    finally:
        client.CoreV1Api(api_client).delete_namespace(namespace)
