"""The operator as a separate process for integration tests, and the job manifests they use.

The operator runs exactly as in production (`python -m stabletrain_operator`) against the
test control plane, watching one namespace, with its metrics and liveness on free loopback
ports; when its environment plans crash points, through the wrapper that adds them
(support/operator_crashpoints.py, which `python -m` finds through PYTHONPATH). Stopping
deletes the namespace's jobs first while the operator still runs: kopf puts a finalizer on
every object that has a daemon, and only a running operator removes it, so a job left
behind would hold its namespace in Terminating forever.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from stabletrain_agent.checkpoint.signing import CheckpointKey
from stabletrain_contract.env import CHECKPOINT_KEY_SECRET_KEY
from stabletrain_operator import naming
from stabletrain_operator.api.cluster_policy import POLICY_PLURAL
from stabletrain_operator.api.constants import CRD_NAME, GROUP, PLURAL, VERSION
from stabletrain_operator.generate.crds import CRD_PATH, POLICY_CRD_PATH
from stabletrain_operator.tenancy.limits import DEFAULT_HOST_PATH_PREFIXES
from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.operator_crashpoints import CRASH_AFTER_ENV, planned_phases
from support.operator_crashpoints import MODULE as CRASHING_OPERATOR
from support.processes import ManagedProcess, free_port

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "support" / "workloads" / "contract_worker.py"
PROGRESS_WRITE_SECONDS = 1.0
"""Tests wait on step and loss in status, so they get them every second (the chart: 30 s)."""
Json = dict[str, Any]


def install_crd(plane: ControlPlane) -> None:
    """Server-side apply of the generated CRDs (jobs and platform policies, as the chart
    installs them), then wait until both are Established."""
    for path in (CRD_PATH, POLICY_CRD_PATH):
        subprocess.run(
            plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / path)),
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
    for name in (CRD_NAME, f"{POLICY_PLURAL}.{GROUP}"):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = subprocess.run(
                plane.kubectl("get", "crd", name, "-o", f"jsonpath={jsonpath}"),
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            if state.stdout.strip() == "True":
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"CRD {name} not Established within 30 s")


class OperatorProcess:
    """One operator process; `kill()` is a SIGKILL, `start()` may be called again after it."""

    def __init__(
        self,
        plane: ControlPlane,
        namespace: str,
        log_path: Path,
        env: Mapping[str, str] = {},
        *,
        progress_write_seconds: float = PROGRESS_WRITE_SECONDS,
        args: Sequence[str] = (),
    ) -> None:
        self.plane = plane
        self.args = tuple(args)
        self.progress_write_seconds = progress_write_seconds
        self.namespace = namespace
        self.log_path = log_path
        self.extra_env = dict(env)
        self.metrics_port = 0
        self.liveness_url = ""
        self.process: ManagedProcess | None = None

    def start(self, env: Mapping[str, str] | None = None) -> None:
        self.metrics_port = free_port()
        liveness = self.liveness_url = f"http://127.0.0.1:{free_port()}/healthz"
        full_env = {**self.plane.env(), **self.extra_env, **(env or {})}
        module = "stabletrain_operator"
        if planned_phases(full_env):
            module = CRASHING_OPERATOR
            paths = [str(REPO / "tests"), full_env.get("PYTHONPATH", "")]
            full_env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        argv = [
            sys.executable, "-m", module, "--namespace", self.namespace,
            "--metrics-port", str(self.metrics_port), "--liveness", liveness,
            "--progress-write-seconds", str(self.progress_write_seconds), *self.args,
        ]  # fmt: skip
        if os.environ.get("STABLETRAIN_TEST_OPERATOR_VERBOSE"):
            argv.append("--verbose")
        argv += self.args
        self.process = ManagedProcess("operator", argv, self.log_path, env=full_env)

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def wait_dead(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.alive()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def probe(self) -> int:
        """HTTP status of kopf's liveness endpoint."""
        with urllib.request.urlopen(self.liveness_url, timeout=5) as response:
            return int(response.status)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def delete_jobs(api_client: client.ApiClient, namespace: str, timeout: float = 60) -> None:
    """Delete every job of the namespace and wait until the operator released them."""
    custom: Any = client.CustomObjectsApi(api_client)
    with contextlib.suppress(client.ApiException):
        custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        if not listed["items"]:
            return
        time.sleep(0.2)


@contextlib.contextmanager
def running_operator(
    plane: ControlPlane,
    api_client: client.ApiClient,
    namespace: str,
    log_path: Path,
    env: Mapping[str, str] = {},
    *,
    progress_write_seconds: float = PROGRESS_WRITE_SECONDS,
    args: Sequence[str] = (),
) -> Iterator[OperatorProcess]:
    """The operator serving `namespace`, with more command-line `args` (e.g. --kueue)."""
    operator = OperatorProcess(
        plane, namespace, log_path, env, progress_write_seconds=progress_write_seconds, args=args
    )
    operator.start()
    try:
        yield operator
    finally:
        if not operator.alive():
            operator.start(env={CRASH_AFTER_ENV: ""})
        delete_jobs(api_client, namespace)
        operator.stop()


def create_claim(core: Any, namespace: str, name: str = "pfs") -> None:
    body: Json = {
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    core.create_namespaced_persistent_volume_claim(namespace, body)


def job_manifest(
    name: str,
    worker_env: Mapping[str, str],
    *,
    nodes: int = 2,
    recovery: Json | None = None,
    detection: Json | None = None,
) -> Json:
    """A job whose pods run the contract worker under torchrun, 2 nodes x 1 process."""
    container = {
        "name": "trainer",
        "image": "local",
        "command": ["torchrun", str(WORKER)],
        "env": [{"name": k, "value": v} for k, v in worker_env.items()],
    }
    spec: Json = {
        "workers": {
            "nodes": nodes,
            "processesPerNode": 1,
            "rendezvous": {"timeoutSeconds": 60},
            "template": {"spec": {"containers": [container], "terminationGracePeriodSeconds": 5}},
        },
        "checkpoints": {
            "local": {"hostPath": DEFAULT_HOST_PATH_PREFIXES[0]},
            "pfs": {"claimName": "pfs"},
            "intervalSteps": 5,
        },
        "detection": detection
        or {
            "baseline": {"warmupSteps": 3, "minSamples": 3},
            "nonFinite": {"consecutiveSteps": 1},
        },
    }
    if recovery is not None:
        spec["recovery"] = recovery
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StableTrainingJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def checkpoint_key(core: Any, namespace: str, job: str) -> CheckpointKey:
    """The key the job's pods sign their checkpoints with, read from its Secret (what a test
    needs to verify a copy the way the pods do)."""
    secret = core.read_namespaced_secret(naming.token_secret(job), namespace)
    raw = (secret.data or {}).get(CHECKPOINT_KEY_SECRET_KEY)
    return CheckpointKey(base64.b64decode(raw) if raw else None)


class Jobs:
    """Reads and waits on jobs of one namespace."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        # Any: plain dicts go in and come out (the typed client's models are not needed here).
        self.api_client: Any = api_client
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.core: Any = client.CoreV1Api(api_client)
        self.namespace = namespace

    def create(self, manifest: Json) -> Json:
        created: Json = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, manifest
        )
        return created

    def get(self, name: str) -> Json:
        job: Json = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return job

    def patch_spec(self, name: str, spec: Json) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec}
        )

    def status(self, name: str) -> Json:
        return dict(self.get(name).get("status") or {})

    def wait(self, name: str, check: Any, timeout: float, what: str) -> Json:
        """Polls the job's status until `check(status)` is truthy; the error shows the last."""
        deadline = time.monotonic() + timeout
        status: Json = {}
        while time.monotonic() < deadline:
            status = self.status(name)
            if check(status):
                return status
            time.sleep(1.0)
        pods = [
            (p["metadata"]["name"], p.get("status", {}).get("phase"),
             p["spec"].get("nodeName"), p.get("status", {}).get("conditions"),
             [c.get("state") for c in p.get("status", {}).get("containerStatuses") or []])
            for p in self.pods(name)
        ]  # fmt: skip
        raise AssertionError(
            f"timed out after {timeout} s waiting for {what}; status: {status}; pods: {pods}"
        )

    def _plain(self, items: Any) -> list[Json]:
        return [self.api_client.sanitize_for_serialization(item) for item in items]

    def pods(self, name: str) -> list[Json]:
        """The job's pods as JSON (camelCase), as kubectl would show them."""
        listed = self.core.list_namespaced_pod(self.namespace, label_selector=f"{GROUP}/job={name}")
        return self._plain(listed.items)

    def events(self, name: str) -> list[Json]:
        """Events on the job, oldest first (by resourceVersion: timestamps have 1 s resolution)."""
        selector = f"involvedObject.name={name}"
        listed = self.core.list_namespaced_event(self.namespace, field_selector=selector)
        events = self._plain(listed.items)
        return sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))

    def config_map(self, name: str) -> Json:
        found: Json = self._plain([self.core.read_namespaced_config_map(name, self.namespace)])[0]
        return found


def worker_log(cluster: LocalCluster, namespace: str, attempt: int, rank: int) -> list[Any]:
    """The contract worker's per-step JSON lines of one rank of one attempt (on the PFS)."""
    path = cluster.shared_dir / namespace / "pfs" / "log" / f"attempt-{attempt}-rank-{rank}.jsonl"
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def metric(operator: OperatorProcess, name: str, **labels: str) -> float:
    """One sample of the operator's /metrics; 0 when the series does not exist yet."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if wanted else "") + r" (\S+)"
    found = re.search(pattern, operator.metrics())
    return float(found.group(1)) if found else 0.0
