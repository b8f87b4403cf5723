"""Kueue's own manager (cmd/kueue, built by `make k8s-bins`) as a process beside the test
control plane: its CRDs installed, its webhooks reachable, and nothing of Kueue mocked.

- CRDs: the module's config/components/crd/bases, as shipped (no conversion webhook: every
  client here, Kueue included, uses v1beta2, the storage version).
- Webhooks: the module's config/components/webhook/manifests.yaml, each webhook's service
  reference replaced by a URL on 127.0.0.1 and the test CA's bundle; the manager serves them
  with a certificate from the test PKI (internal cert management off). The configurations
  are removed when the manager stops: their failurePolicy is Fail, and pods and Jobs created
  later in the session must not wait on a webhook that is gone.
- Kueue reads its metrics serving certificate from a fixed path, /etc/kueue/metrics/certs,
  when internal cert management is off. The manager runs in a mount namespace of its own
  whose /etc is an overlay of the host's with that directory added, so the host's /etc is
  never written.
- Health, metrics and webhook ports are free loopback ports; the visibility server is off
  (its feature gate), leader election is off.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from stabletrain_operator.queue.workload import EXTERNAL_FRAMEWORK, KUEUE_GROUP, KUEUE_VERSION
from support.controlplane import ControlPlane
from support.processes import ManagedProcess, free_port

KUEUE_PIN = "v0.17.0"
"""The version hack/k8s-bins.sh builds (its KUEUE_VERSION)."""
WAIT_FOR_PODS_READY = "5m"
"""Kueue's waitForPodsReady timeout here: on, so Kueue reads the jobs' PodsReady condition,
and long enough that no test's pods are evicted for starting slowly under load."""
Json = dict[str, Any]


def kueue_dir(plane: ControlPlane) -> Path:
    directory = plane.bin_dir / f"kueue-{KUEUE_PIN}"
    if not (directory / "kueue").exists():
        raise RuntimeError(
            f"Kueue {KUEUE_PIN} missing in {directory}. Run `make k8s-bins` (or `make test`)."
        )
    return directory


def install_kueue_crds(plane: ControlPlane) -> None:
    """Server-side apply of Kueue's CRDs, then wait until each is Established."""
    crds = sorted((kueue_dir(plane) / "crds").glob("*.yaml"))
    argv = ["apply", "--server-side", "--force-conflicts"]
    for path in crds:
        argv += ["-f", str(path)]
    subprocess.run(plane.kubectl(*argv), check=True, capture_output=True, timeout=120)
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in crds]
    subprocess.run(
        plane.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                      *(f"crd/{n}" for n in names)),
        check=True, capture_output=True, timeout=90,
    )  # fmt: skip


def _config(workdir: Path, ports: dict[str, int], certs: Path) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['health']}"},
            "metrics": {"bindAddress": f"127.0.0.1:{ports['metrics']}"},
            "webhook": {"port": ports["webhook"], "host": "127.0.0.1", "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "featureGates": {"VisibilityOnDemand": False},
            "waitForPodsReady": {"timeout": WAIT_FOR_PODS_READY},
            "integrations": {
                "frameworks": ["batch/job"],
                "externalFrameworks": [EXTERNAL_FRAMEWORK],
            },
        }
    )


def webhook_configurations(manifests: str, port: int, ca_bundle: bytes, suffix: str) -> list[Json]:
    """Kueue's webhook configurations pointed at the manager on 127.0.0.1:`port`."""
    configurations = []
    for document in yaml.safe_load_all(manifests):
        if not document:
            continue
        changed = copy.deepcopy(document)
        changed["metadata"]["name"] = f"kueue-{suffix}-{document['metadata']['name']}"
        for webhook in changed["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
        configurations.append(changed)
    return configurations


class KueueManager:
    """Kueue's manager running against `plane`; `stop()` removes its webhooks first."""

    def __init__(self, plane: ControlPlane, api_client: client.ApiClient, workdir: Path) -> None:
        self.plane = plane
        self.admission: Any = client.AdmissionregistrationV1Api(api_client)
        self.workdir = workdir
        self.ports = {"health": free_port(), "metrics": free_port(), "webhook": free_port()}
        self.webhooks: list[Json] = []
        self.process: ManagedProcess | None = None
        self.log_path = workdir / "kueue.log"

    def start(self, timeout: float = 120) -> None:
        directory = kueue_dir(self.plane)
        certs = self.workdir / "certs"
        certs.mkdir(parents=True)
        pair = self.plane.ca.issue("kueue-webhook", "kueue-webhook", server_ips=("127.0.0.1",))
        shutil.copy(pair.cert, certs / "tls.crt")
        shutil.copy(pair.key, certs / "tls.key")
        config = self.workdir / "kueue-config.yaml"
        config.write_text(_config(self.workdir, self.ports, certs))
        upper, work = self.workdir / "etc-upper", self.workdir / "etc-work"
        upper.mkdir()
        work.mkdir()
        script = (
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc"
            f" && mkdir -p /etc/kueue/metrics/certs && cp {certs}/tls.crt {certs}/tls.key"
            f" /etc/kueue/metrics/certs/ && exec {directory / 'kueue'} --config={config}"
        )
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script]
        self.process = ManagedProcess("kueue", argv, self.log_path, env=self.plane.env())
        self._wait_ready(timeout)
        suffix = uuid.uuid4().hex[:6]
        manifests = (directory / "webhooks.yaml").read_text()
        ca = self.plane.ca.cert_path.read_bytes()
        for configuration in webhook_configurations(manifests, self.ports["webhook"], ca, suffix):
            if configuration["kind"] == "MutatingWebhookConfiguration":
                self.admission.create_mutating_webhook_configuration(configuration)
            else:
                self.admission.create_validating_webhook_configuration(configuration)
            self.webhooks.append(configuration)

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        url = f"http://127.0.0.1:{self.ports['health']}/readyz"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise RuntimeError(f"kueue exited while starting:\n{self.process.log_tail()}")
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(url, timeout=2) as response,
            ):
                if response.status == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"kueue not ready after {timeout} s:\n{self.process.log_tail()}")

    def stop(self) -> None:
        for configuration in self.webhooks:
            name = configuration["metadata"]["name"]
            with contextlib.suppress(client.ApiException):
                if configuration["kind"] == "MutatingWebhookConfiguration":
                    self.admission.delete_mutating_webhook_configuration(name)
                else:
                    self.admission.delete_validating_webhook_configuration(name)
        self.webhooks.clear()
        if self.process is not None:
            self.process.stop()
            self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def running_kueue(
    plane: ControlPlane, api_client: client.ApiClient, workdir: Path
) -> Iterator[KueueManager]:
    manager = KueueManager(plane, api_client, workdir)
    try:
        manager.start()
        yield manager
    finally:
        manager.stop()


KINDS = {
    "resourceflavors": "ResourceFlavor",
    "clusterqueues": "ClusterQueue",
    "localqueues": "LocalQueue",
    "workloadpriorityclasses": "WorkloadPriorityClass",
}


class KueueObjects:
    """Kueue's objects for a test: flavors, queues and priority classes (cluster-scoped ones
    named uniquely by the caller), and the Workloads of a namespace."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.custom: Any = client.CustomObjectsApi(api_client)

    def create(self, plural: str, body: Json, namespace: str | None = None) -> Json:
        full = {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": KINDS[plural], **body}
        if namespace is None:
            created: Json = self.custom.create_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, plural, full
            )
        else:
            created = self.custom.create_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, plural, full
            )
        return created

    def patch(self, plural: str, name: str, body: Json) -> None:
        self.custom.patch_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name, body)

    def delete(self, plural: str, name: str) -> None:
        with contextlib.suppress(client.ApiException):
            self.custom.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, plural, name)

    def workloads(self, namespace: str) -> list[Json]:
        listed = self.custom.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads"
        )
        return list(listed["items"])

    def cluster_queue(self, name: str) -> Json:
        found: Json = self.custom.get_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", name
        )
        return found


def condition(workload: Json, kind: str) -> Json | None:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def is_true(workload: Json, kind: str) -> bool:
    found = condition(workload, kind)
    return found is not None and found["status"] == "True"
