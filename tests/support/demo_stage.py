"""The demo's stage: a control plane, two local nodes and the operator, stopped on any exit.

`examples/tiny-gpt/demo.py` (`make demo`) runs the self-healing demo on it, and the
recovery-timeline and chaos benchmarks reuse it; what it keeps when it ends (the job's
logs, Events and the operator's log) lands in the output directory either way.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from kubernetes import client, config

from support.controlplane import ControlPlane, running_control_plane
from support.localnode import LocalCluster
from support.operator import Jobs, OperatorProcess, create_claim, install_crd, running_operator
from support.timeline import Recorder

NAMESPACE = "demo"
JOB = "tiny-gpt"
TIMEOUT_S = 900


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so every process started is stopped on the way out."""
    signal.signal(signal.SIGTERM, _interrupt)


def say(text: str) -> None:
    print(text, flush=True)


def make_namespace(api_client: client.ApiClient, namespace: str = NAMESPACE) -> None:
    """The namespace, once kube-controller-manager made what pods need in it (the default
    ServiceAccount and kube-root-ca.crt); admission rejects pods before that."""
    core: Any = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": namespace}})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        accounts = core.list_namespaced_service_account(namespace).items
        maps = core.list_namespaced_config_map(namespace).items
        if any(a.metadata.name == "default" for a in accounts) and any(
            m.metadata.name == "kube-root-ca.crt" for m in maps
        ):
            create_claim(core, namespace)
            return
        time.sleep(0.2)
    raise RuntimeError(f"namespace {namespace}: no default ServiceAccount after 60 s")


def follow(jobs: Jobs, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Print each phase change with the step and loss the operator last scraped."""
    last = ""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        status = jobs.status(JOB)
        phase = str(status.get("phase", ""))
        if phase and phase != last:
            loss = status.get("loss")
            shown = f"loss {loss:.3f}" if isinstance(loss, float) else "loss -"
            say(f"  [{time.monotonic() - began:6.1f} s] {phase:<12} attempt "
                f"{status.get('attempt', 0)}, step {status.get('step', '-')}, {shown}")  # fmt: skip
            last = phase
        if phase in ("Succeeded", "Failed"):
            return status
        time.sleep(0.25)
    raise RuntimeError(f"the job did not finish within {timeout} s (last phase {last})")


def kubectl(plane: ControlPlane, *args: str) -> str:
    done = subprocess.run(
        plane.kubectl(*args), capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout + done.stderr


def keep_artifacts(cluster: LocalCluster, jobs: Jobs, out: Path) -> None:
    """The job's last status and every container's log, for a look after the demo."""
    with contextlib.suppress(client.ApiException):
        (out / "status.json").write_text(json.dumps(jobs.status(JOB), indent=1))
    for node in cluster.node_names:
        logs = cluster.node_dir(node) / "logs"
        if logs.exists():
            shutil.copytree(logs, out / "pod-logs" / node, dirs_exist_ok=True)


@dataclass
class Stage:
    """Everything a healing run needs, started; see `stage()`."""

    plane: ControlPlane
    cluster: LocalCluster
    jobs: Jobs
    recorder: Recorder
    operator: OperatorProcess
    api_client: client.ApiClient


@contextlib.contextmanager
def stage(
    work: Path,
    out: Path,
    manifest: dict[str, Any] | None,
    *,
    nodes: Sequence[str] = ("node-a", "node-b"),
    namespace: str = NAMESPACE,
) -> Iterator[Stage]:
    """Control plane, CRD, namespace, local nodes, operator, a recorder on the job, and
    the job created (unless `manifest` is None: the caller creates its jobs); all of it
    stopped again, in reverse order, however the block ends."""
    with contextlib.ExitStack() as stack:
        say("starting a control plane (etcd, kube-apiserver, kube-controller-manager) ...")
        plane = stack.enter_context(running_control_plane())
        api_client: Any = config.new_client_from_config(config_file=str(plane.kubeconfig))  # type: ignore[no-untyped-call]
        stack.callback(api_client.close)
        install_crd(plane)
        make_namespace(api_client, namespace)
        say(f"starting the local nodes {', '.join(nodes)}, and the operator ...")
        cluster = stack.enter_context(LocalCluster(api_client, nodes, root=work / "localnode"))
        operator_log = out / "operator.log"
        operator = stack.enter_context(running_operator(plane, api_client, namespace, operator_log))
        recorder = stack.enter_context(Recorder(api_client, namespace, JOB))
        jobs = Jobs(api_client, namespace)
        stack.callback(keep_artifacts, cluster, jobs, out)
        if manifest is not None:
            jobs.create(manifest)
        yield Stage(plane, cluster, jobs, recorder, operator, api_client)
        say("stopping the operator, the nodes and the control plane ...")
