"""The upgrade procedure of docs/operations.md on the real control plane: the CRD is applied
with `kubectl apply --server-side --force-conflicts`, then `helm upgrade` changes the
release and leaves the applied CRD alone (Helm never upgrades crds/)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from support.chart import CHART, helm
from support.controlplane import ControlPlane

CRD_FILE = CHART / "crds" / "stabletrainingjobs.yaml"
CRD_NAME = "stabletrainingjobs.stabletrain.dev"
DESCRIPTION = "{.spec.versions[0].schema.openAPIV3Schema.description}"


def kubectl(
    plane: ControlPlane, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        plane.kubectl(*args), input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def helm_env(control_plane: ControlPlane, tmp_path: Path) -> dict[str, str]:
    env = control_plane.env()
    for kind in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{kind}_HOME"] = str(tmp_path / f"helm-{kind.lower()}")
    return env


@pytest.fixture
def release(
    api_client: client.ApiClient, namespace: str, helm_env: dict[str, str]
) -> Iterator[str]:
    name = f"u{uuid.uuid4().hex[:6]}"
    done = helm(
        "install",
        name,
        str(CHART),
        "-n",
        namespace,
        "--set",
        f"watchNamespaces={{{namespace}}}",
        env=helm_env,
    )
    assert done.returncode == 0, done.stderr
    try:
        yield name
    finally:
        helm("uninstall", name, "-n", namespace, "--wait", env=helm_env)


def helm_owns_versions(plane: ControlPlane) -> bool:
    crd = json.loads(
        kubectl(plane, "get", "crd", CRD_NAME, "-o", "json", "--show-managed-fields").stdout
    )
    return any(
        entry["manager"] == "helm" and "f:versions" in entry.get("fieldsV1", {}).get("f:spec", {})
        for entry in crd["metadata"]["managedFields"]
    )


def test_crd_applied_server_side_then_helm_upgrade(
    control_plane: ControlPlane, namespace: str, release: str, helm_env: dict[str, str]
) -> None:
    original = CRD_FILE.read_text()
    newer = yaml.safe_load(original)
    newer["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = f"v-{release}"
    try:
        if helm_owns_versions(control_plane):
            # This install created the CRD: without --force-conflicts the apply is refused.
            plain = kubectl(
                control_plane, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(newer)
            )
            assert plain.returncode != 0
            assert 'conflict with "helm"' in plain.stderr, plain.stderr
        applied = kubectl(
            control_plane,
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            stdin=yaml.safe_dump(newer),
        )
        assert applied.returncode == 0, applied.stderr
        assert "serverside-applied" in applied.stdout

        upgraded = helm(
            "upgrade",
            release,
            str(CHART),
            "-n",
            namespace,
            "--reset-then-reuse-values",
            "--set",
            "operator.verbose=true",
            env=helm_env,
        )
        assert upgraded.returncode == 0, upgraded.stderr
        assert "REVISION: 2" in upgraded.stdout
        deployment = json.loads(
            kubectl(
                control_plane,
                "get",
                "deployment",
                f"{release}-stabletrain",
                "-n",
                namespace,
                "-o",
                "json",
            ).stdout
        )
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--verbose" in args
        assert f"--namespace={namespace}" in args
        kept = kubectl(control_plane, "get", "crd", CRD_NAME, "-o", f"jsonpath={DESCRIPTION}")
        assert kept.stdout == f"v-{release}", "helm upgrade must leave the applied CRD alone"
    finally:
        restored = kubectl(
            control_plane, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=original
        )
        assert restored.returncode == 0, restored.stderr
