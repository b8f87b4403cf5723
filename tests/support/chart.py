"""The Helm chart as the tests see it: the real helm binary renders, lints and installs it.

Nothing here parses templates itself: every manifest a test looks at is what `helm
template` printed, so a test fails exactly when what users would install is wrong.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support.controlplane import binary_dir

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "stabletrain"
CI_VALUES = CHART / "ci"
ALL_ON_VALUES = (
    CI_VALUES / "cluster-all-on-values.yaml",
    CI_VALUES / "namespaced-all-on-values.yaml",
)
"""Between them, every option of values.yaml is on (cluster-wide and namespaced modes)."""
KUBE_VERSION = "v1.34.4"
"""The control plane's version: renders target the cluster the tests run against."""
MONITORING_CRD_KINDS = ("servicemonitors", "podmonitors", "prometheusrules")

Manifest = dict[str, Any]


def helm_binary() -> Path:
    return binary_dir(("helm",)) / "helm"


def monitoring_crds() -> list[Path]:
    """The monitoring.coreos.com CRDs `make k8s-bins` fetched from prometheus-operator."""
    default = Path.home() / ".cache" / "stabletrain" / "k8s" / "monitoring-crds" / "v0.85.0"
    directory = Path(os.environ.get("STABLETRAIN_MONITORING_CRDS_DIR", default))
    files = [directory / f"monitoring.coreos.com_{kind}.yaml" for kind in MONITORING_CRD_KINDS]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise RuntimeError(
            f"monitoring CRDs missing: {', '.join(missing)}. Run `make k8s-bins` "
            "(hack/monitoring-crds.sh fetches them from the Go module proxy)."
        )
    return files


def promql_check() -> Path:
    """The PromQL parser check `make k8s-bins` built (hack/promql-check.sh)."""
    default = Path.home() / ".cache" / "stabletrain" / "k8s" / "promql-check-v0.316.0"
    binary = Path(os.environ.get("STABLETRAIN_PROMQL_CHECK_DIR", default)) / "promql-check"
    if not binary.is_file():
        raise RuntimeError(f"{binary} missing. Run `make k8s-bins` (hack/promql-check.sh).")
    return binary


def parse_promql(expressions: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Prometheus' own parser over the expressions; stdout names each one that fails."""
    return subprocess.run(
        [str(promql_check())],
        input=json.dumps(list(expressions)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def helm(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def value_args(values_files: Sequence[Path] = (), sets: Sequence[str] = ()) -> list[str]:
    args: list[str] = []
    for path in values_files:
        args += ["-f", str(path)]
    for assignment in sets:
        args += ["--set", assignment]
    return args


@dataclass(frozen=True)
class Rendered:
    """One `helm template` run: its manifests in output order."""

    text: str
    manifests: list[Manifest]

    def of_kind(self, kind: str) -> list[Manifest]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str) -> Manifest:
        found = self.of_kind(kind)
        assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
        return found[0]

    def hooks(self) -> list[Manifest]:
        return [m for m in self.manifests if "helm.sh/hook" in annotations_of(m)]

    def kinds(self) -> list[str]:
        return [m["kind"] for m in self.manifests]


def annotations_of(manifest: Manifest) -> dict[str, str]:
    found: dict[str, str] = manifest.get("metadata", {}).get("annotations") or {}
    return found


def render(
    values_files: Sequence[Path] = (),
    sets: Sequence[str] = (),
    release: str = "st",
    namespace: str = "stabletrain-system",
    extra: Sequence[str] = (),
) -> Rendered:
    """`helm template` (hooks included, CRDs of crds/ not); raises with helm's message."""
    done = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
        *value_args(values_files, sets),
        *extra,
    )
    if done.returncode != 0:
        raise RenderError(done.stderr)
    manifests = [m for m in yaml.safe_load_all(done.stdout) if m]
    return Rendered(done.stdout, manifests)


class RenderError(Exception):
    """helm refused the values; the message is helm's stderr."""


def dump(manifests: Sequence[Manifest]) -> str:
    return yaml.safe_dump_all(list(manifests), sort_keys=False)
