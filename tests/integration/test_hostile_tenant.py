"""The hostile tenant (issue 29): a team that shares the operator tries to get more than its
own job, against the real API server and the operator run as in production.

One section per point of the issue; each test failed on the operator before the fix (the
assertion it failed on is named in its docstring). This module imports nothing of the
operator that the operator before the fix lacked, so it runs against either.

Sections: 1 node directories and Pod Security, 4 specs that cannot wedge the reconcile,
5 ownership by UID, 6 the job's NetworkPolicy, 7 node remediation (the operator's side,
tenant-op); the agent's side (2 signed checkpoints, 3 bounded scrapes, 8 version skew) has
its own section.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stabletrain_agent.contract import env
from stabletrain_operator import naming
from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION
from support.controlplane import ControlPlane, request_counts
from support.localnode import LocalCluster
from support.loopback_http import serving
from support.operator import Jobs, create_claim, job_manifest, running_operator

Json = dict[str, Any]
NODE_DIRECTORY = "/var/lib/stabletrain"
"""The operator's default allowed node directory."""
HELD_SECONDS = 60
"""How long a test waits for a job's InvalidSpec condition (the operator's first tick)."""


@pytest.fixture
def tenant_namespace(stj_crd: str, api_client: client.ApiClient, pod_namespace: str) -> str:
    """A namespace for jobs with the PFS claim and no node: pods stay Pending, which is all
    these tests need (what the operator creates, reads and sends is what they look at)."""
    create_claim(client.CoreV1Api(api_client), pod_namespace)
    return pod_namespace


@contextlib.contextmanager
def operator_running(
    plane: ControlPlane, api_client: client.ApiClient, namespace: str, tmp_path: Path,
    *args: str,
) -> Iterator[None]:  # fmt: skip
    with running_operator(plane, api_client, namespace, tmp_path / "operator.log", args=args):
        yield


def manifest(name: str, *, template: Json | None = None, host_path: str = NODE_DIRECTORY) -> Json:
    """A 2-node job whose pods never need to run."""
    job = job_manifest(name, {})
    if template is not None:
        job["spec"]["workers"]["template"] = template
    job["spec"]["checkpoints"]["local"] = {"hostPath": host_path}
    return job


def container(**fields: Any) -> Json:
    return {"name": "trainer", "image": "local", "command": ["torchrun", "train.py"], **fields}


def condition(status: Json, kind: str) -> Json | None:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), None)


def held(jobs: Jobs, name: str) -> Json:
    """The job's InvalidSpec condition once it is True."""
    status = jobs.wait(
        name,
        lambda s: (c := condition(s, "InvalidSpec")) is not None and c["status"] == "True",
        HELD_SECONDS,
        f"job {name} to be held with InvalidSpec",
    )
    found = condition(status, "InvalidSpec")
    assert found is not None
    return found


def pods_named_for(core: Any, namespace: str, job: str) -> list[Json]:
    """Every pod of the namespace whose name the operator gives the job's pods."""
    listed = core.list_namespaced_pod(namespace)
    return [
        core.api_client.sanitize_for_serialization(p)
        for p in listed.items
        if p.metadata.name.startswith(f"{job}-a")
    ]


def invalid_spec_events(jobs: Jobs, name: str) -> list[Json]:
    return [e for e in jobs.events(name) if e["reason"] == "InvalidSpec"]


# --- Point 1: a job cannot reach the node beyond its own directory --------------------------


def test_point1_a_job_gets_its_own_node_directory_and_nothing_more(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tenant_namespace: str,
    tmp_path: Path,
) -> None:
    """Before: hostPath `/` was accepted and mounted read-write (the create succeeded); a
    privileged, hostPID template with its own hostPath volume became pods; the pods got the
    default service-account token. After: `/` is refused at admission naming the field,
    /etc and the template are held with InvalidSpec before any pod exists, and an allowed
    job's pods mount <prefix>/<namespace>/<job> without a token."""
    jobs = Jobs(api_client, tenant_namespace)
    core: Any = client.CoreV1Api(api_client)
    with pytest.raises(ApiException) as refused:
        jobs.create(manifest("root", host_path="/"))
    assert refused.value.status == 422
    assert "spec.checkpoints.local.hostPath" in str(refused.value.body)

    privileged = container(securityContext={"privileged": True})
    escape = {"spec": {"hostPID": True, "containers": [privileged],
                       "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}  # fmt: skip
    with operator_running(control_plane, api_client, tenant_namespace, tmp_path):
        jobs.create(manifest("etc", host_path="/etc"))
        jobs.create(manifest("escape", template=escape))
        jobs.create(manifest("own"))
        etc = held(jobs, "etc")
        assert etc["reason"] == "HostPathNotAllowed"
        assert etc["message"].startswith("spec.checkpoints.local.hostPath: '/etc' is not allowed")
        escaped = held(jobs, "escape")
        assert escaped["reason"] == "PodSecurityViolation"
        for field in ("spec.hostPID", "spec.containers[0].securityContext.privileged",
                      "spec.volumes[0].hostPath"):  # fmt: skip
            assert f"spec.workers.template.{field}:" in escaped["message"], escaped["message"]
        jobs.wait("own", lambda s: s.get("phase") == "Running" and len(jobs.pods("own")) == 2,
                  60, "the allowed job's pods")  # fmt: skip
        for pod in jobs.pods("own"):
            volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
            assert volumes["stabletrain-local"]["hostPath"]["path"] == (
                f"{NODE_DIRECTORY}/{tenant_namespace}/own"
            )
            assert pod["spec"]["automountServiceAccountToken"] is False
        assert pods_named_for(core, tenant_namespace, "etc") == []
        assert pods_named_for(core, tenant_namespace, "escape") == []
        jobs.patch_spec("etc", {"checkpoints": {"local": {"hostPath": NODE_DIRECTORY}}})
        fixed = jobs.wait("etc", lambda s: len(jobs.pods("etc")) == 2 and (
            condition(s, "InvalidSpec") or {}).get("status") == "False", 60,
            "the fixed job's pods")  # fmt: skip
        assert (condition(fixed, "InvalidSpec") or {})["reason"] == "SpecAccepted"


# --- Point 4: a spec that passes validation never wedges its reconcile -----------------------

MALFORMED: dict[str, tuple[Json, Json, str]] = {
    "env-string": ({"spec": {"containers": [container(env="oops")]}}, {},
                   "spec.workers.template.spec.containers[0].env"),
    "tolerations-map": ({"spec": {"containers": [container()], "tolerations": {"key": "gpu"}}},
                        {}, "spec.workers.template.spec.tolerations"),
    "labels-string": ({"metadata": {"labels": "team=nlp"}, "spec": {"containers": [container()]}},
                      {}, "spec.workers.template.metadata.labels"),
    "wrong-container": ({"spec": {"containers": [container()]}}, {"containerName": "other"},
                        "spec.workers.containerName"),
    "refused-422": ({"spec": {"containers": [container(name="Not_A_Label")]}}, {},
                    "spec.containers[0].name"),
    "refused-400": ({"spec": {"containers": [container(resources={"limits": {"cpu": "lots"}})]}},
                    {}, "quantities must match"),
}  # fmt: skip
"""Templates the CRD accepts but no pod can be made of: the operator's own merge raised on
the first four, the API server refused the last two."""
OPERATOR_WRITES = {
    ("pods", ""),
    ("secrets", ""),
    ("services", ""),
    ("configmaps", ""),
    ("networkpolicies", ""),
    ("stabletrainingjobs", "status"),
}
"""What the operator writes for a job (dry runs included). Its Events are counted in the
namespace itself, and deletes are left out: earlier tests' namespaces are deleted (and
their pods collected) in the background."""
WRITE_VERBS = frozenset({"POST", "CREATE", "PUT", "UPDATE", "PATCH", "APPLY"})
"""apiserver_request_total's verb label is the HTTP method (POST for a create)."""


def _writes(plane: ControlPlane) -> dict[tuple[str, str, str], int]:
    return {
        key: n
        for key, n in request_counts(plane).items()
        if key[0] in WRITE_VERBS and key[1:] in OPERATOR_WRITES
    }


def test_point4_a_spec_that_cannot_become_pods_is_held_once_and_costs_nothing_more(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tenant_namespace: str,
    tmp_path: Path,
) -> None:
    """Before: the four templates made pod building raise, kopf restarted the daemon every
    second (its first tick's requests each time), the 422 and 400 were retried every 0.5 s,
    and nobody saw an Event; a job named with a dot or 55 characters was accepted (its
    Service, or its hostnames at a high attempt, could never be made). After: the names are
    refused at admission; each template holds its job with InvalidSpec naming the field, one
    Event, no pod, and not one write in the 10 s that follow."""
    jobs = Jobs(api_client, tenant_namespace)
    core: Any = client.CoreV1Api(api_client)
    for name in ("gpt.v2", "x" * 55):
        with pytest.raises(ApiException) as refused:
            jobs.create(manifest(name))
        assert refused.value.status == 422, name
        assert "metadata.name must be a DNS-1035 label" in str(refused.value.body)
    with operator_running(control_plane, api_client, tenant_namespace, tmp_path):
        for name, (template, workers, _) in MALFORMED.items():
            job = manifest(name, template=template)
            job["spec"]["workers"].update(workers)
            jobs.create(job)
        for name, (_, _, field) in MALFORMED.items():
            found = held(jobs, name)
            assert field in found["message"], (name, found)
        time.sleep(2)  # the last job's Event, posted right after its status write
        before, events_before = (
            _writes(control_plane),
            len(core.list_namespaced_event(tenant_namespace).items),
        )
        time.sleep(10)
        after, events_after = (
            _writes(control_plane),
            len(core.list_namespaced_event(tenant_namespace).items),
        )
        grew = {
            key: after[key] - before.get(key, 0)
            for key in after
            if after[key] != before.get(key, 0)
        }
        assert grew == {}, f"writes while every job was held: {grew}"
        assert events_after == events_before
        for name in MALFORMED:
            assert len(invalid_spec_events(jobs, name)) == 1, name
            assert pods_named_for(core, tenant_namespace, name) == [], name
            assert jobs.status(name)["phase"] == "Pending", name


# --- Point 5: ownership by identity, not by label --------------------------------------------

NOW = datetime.now(UTC).isoformat()


class Agent:
    """An agent endpoint on 127.0.0.1 that records every request (path, Authorization) and
    answers as a pod of attempt 0 that applied no directives yet."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                with agent.lock:
                    agent.requests.append(
                        (self.command, self.path, self.headers.get("Authorization", ""))
                    )

            def do_GET(self) -> None:
                self._record()
                body = {"attempt": 0, "node": "elsewhere", "nodeRank": 1, "updatedAt": NOW,
                        "lrScale": 1.0, "appliedGeneration": 0}  # fmt: skip
                self._answer(body)

            def do_PUT(self) -> None:
                self._record()
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self._answer({"outcome": "Applied", "appliedGeneration": 1})

            def _answer(self, body: Json) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        return Handler

    def seen(self) -> list[tuple[str, str, str]]:
        with self.lock:
            return list(self.requests)


def _running_on_loopback(core: Any, namespace: str, pod: str) -> None:
    """What a kubelet would report: the pod runs, at 127.0.0.1 (the test's agent)."""
    status = {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}
    core.patch_namespaced_pod_status(pod, namespace, {"status": status})


def _wait(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_point5_a_pod_with_the_jobs_labels_is_never_scraped_or_sent_the_token(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tenant_namespace: str,
    tmp_path: Path,
) -> None:
    """Before: a pod anybody labelled with the job's name, attempt and rank was indexed as
    the job's: scraped, and sent live directives with the job's bearer token. After: only
    pods the job controls are; the job's own pod, at the same address, gets both (the
    control that the operator did scrape and send in this setup)."""
    jobs = Jobs(api_client, tenant_namespace)
    core: Any = client.CoreV1Api(api_client)
    genuine, impostor = Agent(), Agent()
    with (
        serving(genuine.handler()) as genuine_url,
        serving(impostor.handler()) as impostor_url,
    ):
        genuine_port = int(genuine_url.rsplit(":", 1)[1])
        impostor_port = int(impostor_url.rsplit(":", 1)[1])
        args = ("--agent-port", str(genuine_port))
        with operator_running(control_plane, api_client, tenant_namespace, tmp_path, *args):
            jobs.create(manifest("victim"))
            jobs.wait("victim", lambda s: len(jobs.pods("victim")) == 2, 60, "the job's pods")
            labels = {naming.JOB_LABEL: "victim", naming.ATTEMPT_LABEL: "0",
                      naming.RANK_LABEL: "0"}  # fmt: skip
            agent_port = {"name": naming.AGENT_PORT_NAME, "containerPort": impostor_port}
            core.create_namespaced_pod(tenant_namespace, {
                "metadata": {"name": "impostor", "labels": labels},
                "spec": {"nodeName": "elsewhere", "containers": [container(ports=[agent_port])]},
            })  # fmt: skip
            _running_on_loopback(core, tenant_namespace, "impostor")
            _running_on_loopback(core, tenant_namespace, naming.pod_name("victim", 0, 1))
            secret = core.read_namespaced_secret(naming.token_secret("victim"), tenant_namespace)
            token = secret.data[env.TOKEN_SECRET_KEY]
            _wait(lambda: any(m == "PUT" for m, _, _ in genuine.seen()), 30,
                  "the job's own pod to be scraped and sent its directives")  # fmt: skip
            time.sleep(3)  # several more scrape rounds
        sent = [auth for method, _, auth in genuine.seen() if method == "PUT"]
        assert sent, genuine.seen()
        assert all(auth.startswith("Bearer ") for auth in sent)
        assert token, "the job's token Secret holds a token"
        assert impostor.seen() == [], "the labelled pod that is not the job's was contacted"


def test_point5_a_token_secret_planted_under_the_jobs_name_is_never_used(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tenant_namespace: str,
    tmp_path: Path,
) -> None:
    """Before: a create answered 409 was taken as the job's own object, so a Secret planted
    as `<job>-token` became the job's token (known to whoever planted it) and its pods were
    created. After: the job is held with InvalidSpec (NameTaken) naming the Secret, no pod
    is created, and the planted Secret is left as it was."""
    jobs = Jobs(api_client, tenant_namespace)
    core: Any = client.CoreV1Api(api_client)
    planted = {"metadata": {"name": naming.token_secret("mark")},
               "stringData": {env.TOKEN_SECRET_KEY: "known-to-the-planter"}}  # fmt: skip
    core.create_namespaced_secret(tenant_namespace, planted)
    with operator_running(control_plane, api_client, tenant_namespace, tmp_path):
        jobs.create(manifest("mark"))
        found = held(jobs, "mark")
        assert found["reason"] == "NameTaken"
        assert "Secret mark-token" in found["message"]
        time.sleep(2)
        assert pods_named_for(core, tenant_namespace, "mark") == []
    secret = core.read_namespaced_secret(naming.token_secret("mark"), tenant_namespace)
    assert not secret.metadata.owner_references


def jobs_left(custom: Any, namespace: str) -> list[Json]:
    items: list[Json] = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)[
        "items"
    ]
    return items


def test_point5_a_job_recreated_under_the_same_name_adopts_nothing_of_its_predecessor(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tenant_namespace: str,
    tmp_path: Path,
) -> None:
    """Before: the new job took its predecessor's terminating pod (same name, same labels)
    for its own rank 0: the pod's end counted as a failure of the new job and cost it a
    restart (attempt 1). After: the new job waits until garbage collection removed its
    predecessor's objects, then makes its own attempt 0."""
    jobs = Jobs(api_client, tenant_namespace)
    core: Any = client.CoreV1Api(api_client)
    custom: Any = client.CustomObjectsApi(api_client)
    rank0 = naming.pod_name("again", 0, 0)
    hold = {"metadata": {"finalizers": [f"{GROUP}/test-hold"]}}
    with operator_running(control_plane, api_client, tenant_namespace, tmp_path):
        old_uid = jobs.create(manifest("again"))["metadata"]["uid"]
        jobs.wait("again", lambda s: len(jobs.pods("again")) == 2, 60, "the first job's pods")
        core.patch_namespaced_pod(rank0, tenant_namespace, hold)
        core.delete_namespaced_pod(rank0, tenant_namespace)
        custom.delete_namespaced_custom_object(GROUP, VERSION, tenant_namespace, PLURAL, "again")
        _wait(lambda: not jobs_left(custom, tenant_namespace), 30, "the first job to go")
        new_uid = jobs.create(manifest("again"))["metadata"]["uid"]
        try:
            time.sleep(5)  # the predecessor's rank 0 is still terminating
        finally:
            release = [{"op": "remove", "path": "/metadata/finalizers"}]  # a JSON patch
            core.patch_namespaced_pod(rank0, tenant_namespace, release)

        def own_attempt() -> bool:
            owners = [p["metadata"]["ownerReferences"][0]["uid"] for p in jobs.pods("again")
                      if p["metadata"]["name"].startswith("again-a")]  # fmt: skip
            return len(owners) == 2 and set(owners) == {new_uid}

        status = jobs.wait("again", lambda _: own_attempt(), 90, "the new job's own pods")
        assert new_uid != old_uid
        assert status["attempt"] == 0
        assert status.get("counters", {}).get("restarts", 0) == 0
        assert {p["metadata"]["name"] for p in jobs.pods("again")} == {rank0, "again-a0-1"}
        secret = core.read_namespaced_secret(naming.token_secret("again"), tenant_namespace)
        assert secret.metadata.owner_references[0].uid == new_uid


# --- Point 6: the network -------------------------------------------------------------------

OPERATOR_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "stabletrain-system"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "stabletrain"}},
}


def test_point6_every_job_has_its_own_network_policy_with_the_right_peers(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tenant_namespace: str,
    tmp_path: Path,
) -> None:
    """Before: no job had a NetworkPolicy (the chart's was off by default and covered one
    namespace): any pod of the cluster reached the agent, the rendezvous store and the
    collectives. After: `<job>-network` selects the job's pods; the agent port admits the
    operator's pods only, every other TCP port the job's own pods only."""
    jobs = Jobs(api_client, tenant_namespace)
    networking: Any = client.NetworkingV1Api(api_client)
    args = ("--agent-peers", json.dumps([OPERATOR_PEER]))
    with operator_running(control_plane, api_client, tenant_namespace, tmp_path, *args):
        uid = jobs.create(manifest("fenced"))["metadata"]["uid"]
        jobs.wait("fenced", lambda s: len(jobs.pods("fenced")) == 2, 60, "the job's pods")
        policy = networking.api_client.sanitize_for_serialization(
            networking.read_namespaced_network_policy("fenced-network", tenant_namespace)
        )
        ports = jobs.pods("fenced")[0]["spec"]["containers"][0]["ports"]
    own = {"matchLabels": {naming.JOB_LABEL: "fenced"}}
    assert policy["metadata"]["ownerReferences"][0]["uid"] == uid
    assert policy["spec"]["podSelector"] == own
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (agent_port,) = [p["containerPort"] for p in ports if p["name"] == naming.AGENT_PORT_NAME]

    def peers(port: int) -> list[Json]:
        return [
            peer
            for rule in policy["spec"]["ingress"]
            if any(p["port"] <= port <= p.get("endPort", p["port"]) for p in rule["ports"])
            for peer in rule["from"]
        ]

    assert peers(agent_port) == [OPERATOR_PEER]
    rendezvous = manifest("fenced")["spec"]["workers"]["rendezvous"].get("port", 29400)
    for port in (rendezvous, agent_port - 1, agent_port + 1, 1, 65535):
        assert peers(port) == [{"podSelector": own}], port


# --- Point 7: node remediation that one tenant cannot steer ----------------------------------

FORGED_KILL = f'if [ "${env.NODE_RANK}" = 0 ]; then echo "exitcode: -9"; exit 1; fi; sleep 300'
"""Rank 0 ends writing what torchrun writes when a worker is killed by SIGKILL; rank 1 runs on."""


def test_point7_a_forged_kill_in_one_job_never_taints_a_node(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tenant_namespace: str,
    local_cluster: LocalCluster,
    tmp_path: Path,
) -> None:
    """Before (remediation on, Taint after 1 incident): the job's own words, `exitcode: -9`
    on a pod that merely exited 1, made its node the suspect and the operator tainted it,
    for every tenant. After: the node is the job's suspect (its own relaunch keeps away),
    and no node is tainted: remediation counts only incidents the tenant cannot forge,
    from more than one job."""
    jobs = Jobs(api_client, tenant_namespace)
    core: Any = client.CoreV1Api(api_client)
    template = {"spec": {"containers": [container(command=["sh", "-c", FORGED_KILL])],
                         "terminationGracePeriodSeconds": 1}}  # fmt: skip
    taint_key = f"{GROUP}/suspect"
    args = ("--remediate-nodes", "Taint:1")
    try:
        with operator_running(control_plane, api_client, tenant_namespace, tmp_path, *args):
            jobs.create(manifest("forger", template=template))
            status = jobs.wait("forger", lambda s: s.get("suspectNodes"), 90,
                               "the forged kill to make a node the job's suspect")  # fmt: skip
            suspect = status["suspectNodes"][0]
            assert "killed by signal 9" in suspect["lastReason"]
            time.sleep(3)  # the remediation follows the status write in the same tick
            tainted = {
                node.metadata.name: [t.value for t in node.spec.taints or [] if t.key == taint_key]
                for node in core.list_node().items
            }
    finally:
        for node in core.list_node().items:  # a taint would reach every later test's pods
            kept = [t for t in node.spec.taints or [] if t.key != taint_key]
            if len(kept) != len(node.spec.taints or []):
                core.patch_node(node.metadata.name, {"spec": {"taints": kept}})
    assert all(values == [] for values in tainted.values()), tainted
