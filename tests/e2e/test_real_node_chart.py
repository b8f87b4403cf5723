"""The install path as a user runs it, on a real kubelet: `helm install` of the chart with the
operator image built from the repository's Dockerfile, the operator pod Running under the
chart's restricted securityContext with its probes and metrics answering, then the tiny GPT
with a poisoned shard in real containers: a loss spike, a rollback in place (the same pod and
container, the training processes restarted by the supervisor), a completed job.

The node is real (containerd, runc, CNI bridge, kubelet, kube-proxy, kube-scheduler; see
tests/support/realnode), so the pods are what a cluster would run: images, the kubelet's env
expansion, volumes, termination messages, probes and grace periods. The training image is
the base image with this checkout's Python environment mounted read-only (docs/testing.md
says why); the operator image is the real one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from support.chart import CHART, helm
from support.operator import Jobs
from support.realnode.leftovers import HostSnapshot, find_leftovers
from support.realnode.node import RealCluster, running_real_cluster
from support.realnode.requirements import node_binaries, unavailable_reason
from support.tinygpt import REPO, StepLogs, job_manifest

pytestmark = pytest.mark.realnode

Json = dict[str, Any]
ROLLBACK = {
    "minStepsBeforeOnset": 25,
    "skipStepsBeforeOnset": 10,
    "skipStepsAfterOnset": 30,
    "rewarmupSteps": 10,
}
"""Resume from step 100 (the poisoned shard is read from step 129) and skip the data of steps
119-159: the shard's 16 steps are all inside, and the run finishes its 170 steps clean."""
RULES = [{"name": "spike", "onSignals": ["LossSpike"], "action": "Rollback", "rollback": ROLLBACK}]
PYTHON_PREFIX = Path(sys.base_prefix)
"""The interpreter the checkout's virtualenv points at; mounted beside the checkout."""


@pytest.fixture(scope="module")
def real_cluster() -> Iterator[RealCluster]:
    """A real node for this module; afterwards the host must be exactly as before."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no real node on this machine: {reason}")
    before = HostSnapshot.take()
    with running_real_cluster(node_binaries()) as cluster:
        print(f"real node timings (s): {cluster.timings}")
        yield cluster
    leftovers = find_leftovers(before, cluster.state.node_id, cluster.state.workdir)
    assert not leftovers, f"the real node left behind: {leftovers}"


@pytest.fixture(scope="module")
def real_api(real_cluster: RealCluster) -> Iterator[client.ApiClient]:
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(real_cluster.plane.kubeconfig)
    )
    yield api
    api.close()  # type: ignore[no-untyped-call]


def _kubectl(cluster: RealCluster, *args: str, check: bool = True) -> str:
    done = subprocess.run(cluster.kubectl(*args), capture_output=True, text=True, check=False)
    if check:
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout + done.stderr


def _pods_with_images(cluster: RealCluster) -> str:
    wide = _kubectl(cluster, "get", "pods", "-A", "-o", "wide")
    images = _kubectl(cluster, "get", "pods", "-A", "-o",
                      "custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,"
                      "IMAGE:.spec.containers[*].image,CONTAINER:.status.containerStatuses[*]"
                      ".containerID")  # fmt: skip
    return (
        f"$ kubectl get pods -A -o wide\n{wide}\n"
        f"$ kubectl get pods -A -o custom-columns=NAMESPACE,NAME,IMAGE,CONTAINER\n{images}"
    )


def _http_get(cluster: RealCluster, url: str) -> tuple[int, str]:
    """GET from inside the node's network, where pod IPs are routed."""

    def get() -> tuple[int, str]:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()

    return cluster.call_in_node(get)


def _node_directory(cluster: RealCluster) -> Path:
    """The node-local tier's node directory (each job gets `<it>/<namespace>/<job>`)."""
    return Path(cluster.state.workdir) / "nvme"


def _training_job(cluster: RealCluster, name: str) -> Json:
    """The example's manifest, with the base image and this checkout mounted read-only."""
    steps = {"TINYGPT_STEPS": "170"}
    manifest = job_manifest(name, steps, recovery={"rules": RULES})
    spec = manifest["spec"]
    # One node here, so both ranks in one pod: two pods of a job on one node would share
    # the node-local tier's hostPath (see docs/testing.md, differences from the local node).
    spec["workers"]["nodes"], spec["workers"]["processesPerNode"] = 1, 2
    spec["checkpoints"]["local"]["hostPath"] = str(_node_directory(cluster))
    pod = spec["workers"]["template"]["spec"]
    container = pod["containers"][0]
    container["image"] = cluster.images["base"].reference
    container["env"].append(
        {"name": "PATH", "value": f"{REPO}/.venv/bin:/usr/local/bin:/usr/bin:/bin"}
    )
    mounts = {"checkout": REPO, "python": PYTHON_PREFIX}
    pod["volumes"] = [
        {"name": volume, "hostPath": {"path": str(path), "type": "Directory"}}
        for volume, path in mounts.items()
    ]
    container["volumeMounts"] = [
        {"name": volume, "mountPath": str(path), "readOnly": True}
        for volume, path in mounts.items()
    ]
    return manifest


def _pfs_claim(core: Any, cluster: RealCluster, namespace: str) -> Path:
    """A hostPath PersistentVolume bound to the claim `pfs`, as a cluster's file system."""
    path = Path(cluster.state.workdir) / "pfs" / namespace
    path.mkdir(parents=True)
    volume = f"pfs-{namespace}"
    core.create_persistent_volume({
        "metadata": {"name": volume},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                 "storageClassName": "", "hostPath": {"path": str(path)},
                 "persistentVolumeReclaimPolicy": "Retain"},
    })  # fmt: skip
    core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": "pfs"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume,
                 "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    return path


@pytest.mark.timeout(1200)
def test_chart_and_image_roll_back_a_poisoned_shard_in_real_containers(
    real_cluster: RealCluster, real_api: client.ApiClient, tmp_path: Path
) -> None:
    cluster = real_cluster
    core: Any = client.CoreV1Api(real_api)
    release_ns, job_ns = "stabletrain-system", f"training-{uuid.uuid4().hex[:6]}"
    for name in (release_ns, job_ns):
        core.create_namespace({"metadata": {"name": name}})
    operator_image = cluster.images["operator"]
    env = cluster.plane.env()
    for kind in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{kind}_HOME"] = str(tmp_path / f"helm-{kind.lower()}")

    began = time.monotonic()
    installed = helm(
        "install", "stabletrain", str(CHART), "-n", release_ns,
        "--set", f"image.repository={operator_image.repository}",
        "--set", f"image.tag={operator_image.tag}",
        "--set", f"watchNamespaces={{{job_ns}}}",
        # The job mounts this checkout and the interpreter from the node (hostPath volumes
        # stand in for a training image here): more than the baseline Pod Security level.
        "--set", "tenancy.podSecurity=privileged",
        "--set", f"tenancy.hostPathPrefixes={{{_node_directory(cluster)}}}",
        "--wait", "--timeout", "3m", env=env,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr + _pods_with_images(cluster)
    print(f"helm install --wait: {time.monotonic() - began:.1f} s")

    (operator,) = core.list_namespaced_pod(release_ns).items
    name, ip = operator.metadata.name, operator.status.pod_ip
    (status,) = operator.status.container_statuses
    assert status.restart_count == 0, _kubectl(
        cluster, "logs", "-n", release_ns, name, "--previous", check=False
    )[-6000:]
    assert operator.status.phase == "Running", operator.status
    assert status.ready, status
    assert status.image.endswith(operator_image.reference), status.image
    assert status.container_id.startswith("containerd://"), status.container_id
    # The restricted securityContext, as the process really runs, not as the spec says.
    identity = _kubectl(cluster, "exec", "-n", release_ns, name, "--",
                        "python", "-c", "import os; print(os.getuid(), os.getgid())")  # fmt: skip
    assert identity.split() == ["65532", "65532"]
    write = subprocess.run(
        cluster.kubectl("exec", "-n", release_ns, name, "--", "python", "-c",
                        "open('/probe', 'w')"),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert write.returncode != 0, write
    assert "Read-only file system" in write.stderr, write.stderr
    assert _http_get(cluster, f"http://{ip}:8080/healthz")[0] == 200
    code, metrics = _http_get(cluster, f"http://{ip}:9090/metrics")
    assert code == 200
    assert "stabletrain_operator_" in metrics, metrics[:500]

    _pfs_claim(core, cluster, job_ns)
    jobs = Jobs(real_api, job_ns)
    jobs.create(_training_job(cluster, "poisoned"))
    jobs.wait("poisoned", lambda s: (s.get("step") or 0) >= 10, 600, "attempt 0 to train")
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in jobs.pods("poisoned")}
    jobs.wait("poisoned", lambda s: s.get("rollbackHistory"), 600, "the rollback")
    jobs.wait("poisoned", lambda s: s.get("phase") == "Running" or s.get("phase") == "Succeeded",
              120, "the relaunch")  # fmt: skip
    pods_during = _pods_with_images(cluster)
    print(pods_during)
    done = jobs.wait("poisoned", lambda s: s.get("phase") in ("Succeeded", "Failed"), 600,
                     "the job to finish")  # fmt: skip
    events = [(e["reason"], e["message"]) for e in jobs.events("poisoned")]
    print("status:", json.dumps(done, indent=1))
    print("events:", "\n".join(f"  {reason}: {message}" for reason, message in events))
    assert done["phase"] == "Succeeded", (done.get("conditions"), events)
    (entry,) = done["rollbackHistory"]
    assert entry["signal"] == "LossSpike", entry
    assert entry["onsetStep"] == 129, entry
    assert entry["toStep"] == 100, entry
    workers = jobs.pods("poisoned")
    assert workers, "the finished job's pods are kept"
    for pod in workers:
        assert pod["spec"]["containers"][0]["image"] == cluster.images["base"].reference
        (worker_status,) = pod["status"]["containerStatuses"]
        assert worker_status["containerID"].startswith("containerd://")
    # In place: the same pod and container ran both attempts, the supervisor restarted the
    # training processes (its own log says so).
    assert before == {p["metadata"]["name"]: p["metadata"]["uid"] for p in workers}
    assert list(before) == ["poisoned-a0-0"]
    assert (entry["restartedInPlace"], entry["replacedPods"]) == (1, 0)
    for pod in workers:
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
        assert pod["metadata"]["labels"]["stabletrain.dev/attempt"] == "1"
    supervisor_log = _kubectl(cluster, "logs", "-n", job_ns, "poisoned-a0-0")
    assert "supervisor: attempt 1 started" in supervisor_log, supervisor_log[-2000:]
    assert operator_image.reference in pods_during
    logs = StepLogs(Path(cluster.state.workdir) / "pfs", job_ns, claim="")
    assert logs.attempts() == [0, 1]
    (operator,) = core.list_namespaced_pod(release_ns).items
    restarts = operator.status.container_statuses[0].restart_count
    assert restarts == 0, _kubectl(
        cluster, "logs", "-n", release_ns, operator.metadata.name, "--previous", check=False
    )[-6000:]
