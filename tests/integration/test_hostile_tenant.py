"""The hostile tenant (issue 29): a job's author, anything running in its pods, or anyone who
can write its storage, tries to get more than its own job from the shared operator and the
job's own processes, against the real API server and the operator run as in production.

One section per point of the issue; each test says what it asserted before the fix (the
operator of e09edf5) and what it asserts now: 1 node directories and Pod Security, 2 signed
checkpoints, 3 bounded scrapes and servers, 4 specs that cannot wedge the reconcile,
5 ownership by UID, 6 the job's NetworkPolicy, the generation bound and the explicit
hand-over, 7 node remediation, 8 version skew.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import pickle
import select
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.client import HTTPConnection
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stabletrain_agent.checkpoint.layout import MANIFEST_NAME
from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.endpoint.exporter import AgentExporter
from stabletrain_agent.endpoint.http_server import MAX_CONNECTIONS
from stabletrain_contract import env
from stabletrain_contract.base import ContractError
from stabletrain_contract.channel import (
    AUTHORIZATION_HEADER,
    DIRECTIVES_HTTP_PATH,
    MAX_ACK_BYTES,
    MAX_STATUS_BYTES,
    DirectiveAck,
    LiveOutcome,
    bearer,
    new_token,
    parse_directive_ack,
    status_credential,
)
from stabletrain_contract.directives import GENERATION_ADVANCE_MAX, Directives
from stabletrain_contract.names import Action
from stabletrain_operator import naming
from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION, Phase
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.machine import Transition, World, advance
from stabletrain_operator.naming import ATTEMPT_LABEL, JOB_LABEL, RANK_LABEL
from stabletrain_operator.observe.pod_facts import PodFacts, pod_facts
from stabletrain_operator.observe.scrape import ScrapeError, Scraper, ScrapeResult, ScrapeTarget
from stabletrain_operator.pod_calls.directive_put import AgentUnreachableError, put_directives
from stabletrain_operator.policy import PolicyLedger
from support.agent_client import fetch_status
from support.controlplane import ControlPlane, request_counts
from support.localnode import LocalCluster
from support.loopback_http import serving
from support.operator import Jobs, OperatorProcess, create_claim, job_manifest, running_operator
from support.processes import ManagedProcess, free_port

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
        # The tier's place is fixed once the job exists (its checkpoints are there): a held
        # hostPath is fixed by a job made anew, a held template by an edit of the job.
        jobs.patch_spec("escape", {"workers": {"template": {"spec": {
            "hostPID": None, "volumes": None, "containers": [container()]}}}})  # fmt: skip
        fixed = jobs.wait("escape", lambda s: len(jobs.pods("escape")) == 2 and (
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
    ("networkpolicies", ""),
    ("stabletrainingjobs", "status"),
}
"""What the operator writes for a job (dry runs included). Its Events and ConfigMaps are
counted in the namespace itself: kube-controller-manager writes its root CA ConfigMap into
every namespace, earlier tests' namespaces being deleted in the background among them, and
the API server's counter cannot say whose a write was. Deletes are left out for the same
reason (those namespaces' pods are collected)."""
WRITE_VERBS = frozenset({"POST", "CREATE", "PUT", "UPDATE", "PATCH", "APPLY"})
"""apiserver_request_total's verb label is the HTTP method (POST for a create)."""


def _writes(plane: ControlPlane) -> dict[tuple[str, str, str], int]:
    return {
        key: n
        for key, n in request_counts(plane).items()
        if key[0] in WRITE_VERBS and key[1:] in OPERATOR_WRITES
    }


def config_map_versions(core: Any, namespace: str) -> dict[str, str]:
    """Each ConfigMap of the namespace with its resourceVersion: any write shows."""
    items = core.list_namespaced_config_map(namespace).items
    return {c.metadata.name: c.metadata.resource_version for c in items}


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
        before, events_before, config_maps_before = (
            _writes(control_plane),
            len(core.list_namespaced_event(tenant_namespace).items),
            config_map_versions(core, tenant_namespace),
        )
        time.sleep(10)
        after, events_after, config_maps_after = (
            _writes(control_plane),
            len(core.list_namespaced_event(tenant_namespace).items),
            config_map_versions(core, tenant_namespace),
        )
        grew = {
            key: after[key] - before.get(key, 0)
            for key in after
            if after[key] != before.get(key, 0)
        }
        assert grew == {}, f"writes while every job was held: {grew}"
        assert events_after == events_before
        assert config_maps_after == config_maps_before
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


HERE = Path(__file__).parent
WORKLOADS = HERE.parent / "support" / "workloads"
MIB = 1024 * 1024
TOKEN = new_token()


# --- shared: an agent endpoint a hostile pod controls, in a process of its own -------------


class HostileAgent:
    """tests/support/workloads/hostile_agent.py serving the files of one directory."""

    def __init__(self, directory: Path, process: ManagedProcess, port: int) -> None:
        self.directory = directory
        self.process = process
        self.url = f"http://127.0.0.1:{port}"

    def serve(self, case: str, body: bytes) -> str:
        """`body` as case `case`; the base URL an agent of that case has."""
        (self.directory / f"{case}.json").write_bytes(body)
        return f"{self.url}/{case}"


@pytest.fixture
def hostile_agent(tmp_path: Path) -> Iterator[HostileAgent]:
    directory = tmp_path / "served"
    directory.mkdir()
    port = free_port()
    process = ManagedProcess(
        "hostile-agent",
        ["python", str(WORKLOADS / "hostile_agent.py"), str(directory), str(port)],
        tmp_path / "hostile-agent.log",
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.alive(), process.log_tail()
                assert time.monotonic() < deadline, "the hostile agent never listened"
                time.sleep(0.05)
        yield HostileAgent(directory, process, port)
    finally:
        process.stop()


def good_status(attempt: int = 0) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "node": "node-b",
        "nodeRank": 1,
        "updatedAt": "2026-11-29T10:00:00Z",
        "step": 12,
        "lrScale": 1.0,
        "appliedGeneration": 1,
    }


def peak_bytes_of(work: Any) -> tuple[Any, int]:
    """Run the coroutine `work` and return its result with the peak of Python memory it
    allocated (tracemalloc: the objects an operator would hold, not the C library's)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        result = asyncio.run(work)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak - before


# --- point 2: a checkpoint is restored only if this job wrote it ---------------------------

GUARDED_WORKER = WORKLOADS / "guarded_worker.py"
PLANTED_MARKER = "pwned-by-a-planted-checkpoint"
"""A file the planted pickle creates on the PFS if any pod ever unpickles it."""


class CreatesAFile:
    """A pickle that, when loaded, creates a file: any code could run in its place."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def plant(copy: Path, name: str, content: bytes) -> None:
    """Replace one file of a committed copy and fix the manifest's size and checksums, as
    anyone who can write the tier can (another job on the same hostPath or claim); the
    signature, which needs the job's key, stays as it was."""
    (copy / name).write_bytes(content)
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    entry = manifest["files"][name]
    entry.update(size=len(content), crc32=f"{zlib.crc32(content):08x}")
    if entry.get("sha256"):
        entry["sha256"] = hashlib.sha256(content).hexdigest()
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))


def copies_of_step(cluster: LocalCluster, host_path: str, pfs: Path, step: int) -> list[Path]:
    """Every copy of `step`: each node's local copies under its hostPath, each PFS part."""
    name = f"step-{step:010d}"
    local = [
        copy
        for node in cluster.node_names
        for copy in cluster.host_path(node, host_path).glob(f"node-*/{name}/attempt-*")
    ]
    return local + sorted((pfs / name).glob("attempt-*/node-*"))


def test_a_planted_checkpoint_is_refused_unread_and_the_job_falls_back(
    operator: OperatorProcess, jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    """A tenant who can write the job's tiers replaces the metadata of the job's newest
    stable checkpoint, on every copy, with a pickle that creates a file, and fixes the
    manifests' sizes and checksums; then the job is rolled back to that step. Before: the
    copies verified (CRC-32 and sizes match) and the relaunched pods unpickled the file
    (it appeared on the PFS). Now: no copy verifies without the job's key, none is
    unpickled, the pods name each in a CheckpointRejected Event, and the rollback lands on
    the newest checkpoint before it."""
    name = "signed"
    manifest = job_manifest(
        name, {"ST_STEPS": "3000", "ST_STEP_SECONDS": "0.1", "ST_CKPT_EVERY": "5"}
    )
    manifest["spec"]["workers"]["template"]["spec"]["containers"][0]["command"] = [
        "torchrun", str(GUARDED_WORKER),
    ]  # fmt: skip
    tiers = manifest["spec"]["checkpoints"]
    tiers["local"]["retention"] = tiers["pfs"]["retention"] = 100  # none gone before the test
    jobs.create(manifest)
    pfs = local_cluster.shared_dir / job_namespace / "pfs"
    marker = pfs / PLANTED_MARKER

    def stable_on_pfs(status: Json) -> list[int]:
        return [c["step"] for c in status.get("checkpoints") or []
                if c["stable"] and c["pfs"]["verified"]]  # fmt: skip

    ready = jobs.wait(name, lambda s: len(stable_on_pfs(s)) >= 3, 240, "three stable checkpoints")
    target = max(stable_on_pfs(ready))
    own_directory = naming.local_tier_host_path(tiers["local"]["hostPath"], job_namespace, name)
    planted = copies_of_step(local_cluster, own_directory, pfs, target)
    assert len(planted) >= 3, planted  # two nodes' local copies and the PFS parts
    hostile = pickle.dumps(CreatesAFile(f"/stabletrain/pfs/{PLANTED_MARKER}"))
    for copy in planted:
        plant(copy, ".metadata", hostile)
    jobs.patch_spec(name, {"manualRollback": {"requestId": "tenant", "toStep": target}})

    def relaunched(status: Json) -> bool:
        history = status.get("rollbackHistory") or []
        return (
            status.get("lastManualRequestId") == "tenant"
            and status.get("phase") in ("Running", "Confirming")
            and bool(history)
            and history[-1].get("toStep") is not None
            and any(
                e["reason"] == "CheckpointRejected" and f"step-{target:010d}" in e["message"]
                for e in jobs.events(name)
            )
        )

    done = jobs.wait(name, lambda s: marker.exists() or relaunched(s), 300, "the rollback")
    rejected = [e["message"] for e in jobs.events(name) if e["reason"] == "CheckpointRejected"]
    print(
        f"\nplanted step {target} ({len(planted)} copies); the rollback went to step "
        f"{done['rollbackHistory'][-1].get('toStep')}; Events:\n  " + "\n  ".join(rejected)
    )
    assert not marker.exists(), "a pod unpickled the planted checkpoint"
    assert done["rollbackHistory"][-1]["toStep"] < target
    assert "CheckpointsUnsigned" not in [e["reason"] for e in jobs.events(name)]


# --- point 3: one job cannot exhaust the shared operator ------------------------------------


def flood_status(entries: int, size: int) -> bytes:
    """A status of `entries` empty inventory entries, padded with JSON whitespace to `size`."""
    head = json.dumps(good_status())[:-1].encode() + b', "inventory": ['
    body = head + b",".join([b"{}"] * entries) + b"]}"
    assert len(body) <= size, (len(body), size)
    return body + b" " * (size - len(body))


def scrape_round(targets: list[ScrapeTarget]) -> tuple[dict[str, Any], int]:
    """One round through a shared Scraper, as the operator scrapes; its results by pod and
    the peak of Python memory it took."""

    async def one_round() -> dict[str, Any]:
        scraper = Scraper()
        try:
            return {r.pod: r for r in await scraper.scrape_all(targets, timeout=30.0)}
        finally:
            await scraper.close()

    results: dict[str, Any]
    results, peak = peak_bytes_of(one_round())
    return results, peak


def test_a_1_mib_status_of_100000_entries_leaves_the_operators_memory_bounded(
    hostile_agent: HostileAgent,
) -> None:
    """Before: a status of up to 1 MiB was read and parsed whole: 100,000 entries became
    hundreds of thousands of validation errors and their messages (the peak is printed).
    Now: no body over MAX_STATUS_BYTES is read (refused unread when its length says so, cut
    off when it gives none), a body under the cap stops at its first bad entry, and a good
    pod scraped in the same round by the same shared scraper is read as always. Each hostile
    pod costs less than two bodies at the cap, and nothing once the round is over."""
    flood = flood_status(100_000, MIB)
    good = ScrapeTarget("good", hostile_agent.serve("good", json.dumps(good_status()).encode()), 0)
    hostile = [
        ScrapeTarget("flood", hostile_agent.serve("flood", flood), 0),
        ScrapeTarget("flood-unsized", hostile_agent.serve("flood-unsized", flood), 0),
        ScrapeTarget(
            "packed", hostile_agent.serve("packed", flood_status(40_000, MAX_STATUS_BYTES - 1)), 0
        ),
    ]
    _, alone = scrape_round([good])
    results, peak = scrape_round([*hostile, good])
    per_pod = (peak - alone) / len(hostile)
    print(
        f"\noperator memory (Python objects) for one scrape round: {alone / MIB:.2f} MiB for "
        f"a good pod alone, {peak / MIB:.2f} MiB with 3 hostile pods beside it (a 1 MiB status "
        f"of 100,000 entries with and without a length, {MAX_STATUS_BYTES - 1} bytes of "
        f"40,000 entries): {per_pod / 1024:.0f} KiB a hostile pod"
    )
    assert results["good"].status is not None
    assert results["good"].status.step == 12
    assert results["flood"].error is ScrapeError.TOO_LARGE
    assert results["flood-unsized"].error is ScrapeError.TOO_LARGE
    assert results["packed"].error is ScrapeError.MALFORMED
    assert all(results[t.pod].status is None for t in hostile)
    assert per_pod < 2 * MAX_STATUS_BYTES, f"{per_pod:.0f} bytes a hostile pod"


def test_a_huge_answer_to_a_directive_put_is_not_read(hostile_agent: HostileAgent) -> None:
    """Before: the answer to a PUT was read whole, however long (64 MiB here), before it
    was found not to be an acknowledgement. Now: no more than MAX_ACK_BYTES is read."""
    flood = b"x" * (64 * MIB)
    sized = hostile_agent.serve("put-flood", flood)
    unsized = hostile_agent.serve("put-flood-unsized", flood)
    directives = Directives(generation=2, attempt=0)

    async def put_both() -> list[BaseException | object]:
        return list(
            await asyncio.gather(
                put_directives(None, sized, directives, "token", 30.0),
                put_directives(None, unsized, directives, "token", 30.0),
                return_exceptions=True,
            )
        )

    outcomes, peak = peak_bytes_of(put_both())
    print(f"\noperator memory for two PUTs answered with 64 MiB each: peak {peak / MIB:.2f} MiB")
    for outcome in outcomes:
        assert isinstance(outcome, ValueError), outcome  # a ContractError
        assert f"over {MAX_ACK_BYTES} bytes" in str(outcome)
    assert peak < 4 * MAX_STATUS_BYTES, f"peak {peak} bytes"


def agent_threads() -> int:
    """Threads serving connections of an agent's HTTP server in this process."""
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def test_the_agents_server_holds_a_bounded_number_of_connections() -> None:
    """Before: every connection got a thread in the training process for as long as its
    client kept it open (200 idle connections, 200 threads). Now: MAX_CONNECTIONS at once,
    each one beyond answered 503 and closed by the accepting thread, and the operator's
    scrape is served once the flood has gone."""
    source = DirectiveSource(0, Directives(generation=1, attempt=0))
    exporter = AgentExporter(source=source, token=TOKEN, node="node-a", node_rank=0)
    exporter.start()
    flood: list[socket.socket] = []
    try:
        before = agent_threads()
        for _ in range(200):
            flood.append(socket.create_connection(("127.0.0.1", exporter.port), timeout=5))
        # A refused connection is answered at once; a held one waits for its request (it
        # is dropped only after REQUEST_TIMEOUT_SECONDS of silence).
        refused: set[socket.socket] = set()
        held = 0
        deadline = time.monotonic() + 5
        while len(refused) + held < len(flood) and time.monotonic() < deadline:
            waiting = [c for c in flood if c not in refused]
            readable, _, _ = select.select(waiting, [], [], 0.2)
            for connection in readable:
                answer = connection.recv(64)
                assert answer.startswith(b"HTTP/1.1 503"), answer
                refused.add(connection)
            held = agent_threads() - before
        print(f"\n200 idle connections: {held} served by a thread, {len(refused)} refused "
              "with 503")  # fmt: skip
        assert len(refused) == len(flood) - held
        assert held <= MAX_CONNECTIONS
    finally:
        for connection in flood:
            connection.close()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status = fetch_status(exporter.url, credential=status_credential(TOKEN))
                break
            except (ContractError, AgentUnreachableError):
                assert time.monotonic() < deadline, "the agent never served again"
                time.sleep(0.1)
        assert status.applied_generation == 1
    finally:
        exporter.stop()


# --- point 6, the agent's side: the generation and the hand-over --------------------------


def raw_put(exporter: AgentExporter, body: dict[str, Any]) -> tuple[int, DirectiveAck]:
    """A PUT of `body` as JSON with the job's token: what any holder of the token can send."""
    connection = HTTPConnection("127.0.0.1", exporter.port, timeout=10)
    try:
        connection.request(
            "PUT", DIRECTIVES_HTTP_PATH, json.dumps(body).encode(),
            {AUTHORIZATION_HEADER: bearer(TOKEN), "Content-Type": "application/json"},
        )  # fmt: skip
        response = connection.getresponse()
        return response.status, parse_directive_ack(response.read())
    finally:
        connection.close()


def test_a_forged_generation_is_bounded_and_the_operators_next_directive_applies() -> None:
    """Before: a token holder could PUT generation 2^62 and every later directive of the
    operator (generation 2, 3, ...) was 'not newer' for that pod until it was relaunched.
    Now: a generation beyond GENERATION_MAX is refused, and so is one more than
    GENERATION_ADVANCE_MAX ahead of the pod's; the operator's next directive applies."""
    source = DirectiveSource(0, Directives(generation=1, attempt=0))
    exporter = AgentExporter(source=source, token=TOKEN, node="node-a", node_rank=0)
    exporter.start()
    try:
        pinned, pinned_ack = raw_put(exporter, {"generation": 2**62, "attempt": 0})
        ahead, ahead_ack = raw_put(
            exporter, {"generation": 2 + GENERATION_ADVANCE_MAX, "attempt": 0}
        )
        operator, operator_ack = raw_put(exporter, {"generation": 2, "attempt": 0, "lrScale": 0.5})
        print(f"\ngeneration 2^62: {pinned} {pinned_ack.message}")
        print(f"generation {2 + GENERATION_ADVANCE_MAX}: {ahead} {ahead_ack.message}")
        print(f"the operator's generation 2: {operator} {operator_ack.outcome}")
        assert operator_ack.outcome is LiveOutcome.APPLIED
        assert (operator, source.applied_generation) == (200, 2)
        assert pinned == 400
        assert "generation" in pinned_ack.message
        assert ahead == 409
        assert ahead_ack.outcome is LiveOutcome.GENERATION_TOO_FAR
    finally:
        exporter.stop()


def test_only_the_operators_read_hands_the_checkpoints_over() -> None:
    """Before: any GET of /v1/status ended the hand-over of a process that ends on an error,
    so another pod's read could let it go before the operator saw its newest copies. Now:
    only a read presenting the job's status credential (the operator's scrape) counts."""
    source = DirectiveSource(0, Directives(generation=1, attempt=0))
    exporter = AgentExporter(source=source, token=TOKEN, node="node-a", node_rank=0)
    exporter.start()
    try:
        exporter.set_inventory([])  # a scan the operator has not seen yet
        fetch_status(exporter.url)  # anyone's read
        by_anyone = exporter.await_inventory_served(1.0)
        fetch_status(exporter.url, credential=status_credential(TOKEN))  # the operator's
        by_operator = exporter.await_inventory_served(10.0)
        print(f"\nhanded over by an unauthenticated read: {by_anyone}; by the operator's: "
              f"{by_operator}")  # fmt: skip
        assert by_operator
        assert not by_anyone
    finally:
        exporter.stop()


# --- point 8: version skew ------------------------------------------------------------------

SKEW = HERE / "skew"
OLDER_AGENTS = sorted(p.name for p in SKEW.glob("agent-*"))
"""Recorded by tests/support/skew_record.py: agent-34a60b2 (the first contract) and
agent-e09edf5 (main before signing and the bounds: what runs while the operator upgrades)."""
NODES = ("node-a", "node-b")


def skew_spec() -> StableTrainingJobSpec:
    rollback = {"minStepsBeforeOnset": 10, "skipStepsBeforeOnset": 2,
                "skipStepsAfterOnset": 5, "rewarmupSteps": 4}  # fmt: skip
    return StableTrainingJobSpec.model_validate(
        {
            "workers": {
                "nodes": 2,
                "template": {"spec": {"containers": [{"name": "t", "command": ["torchrun"]}]}},
            },
            "checkpoints": {"local": {"hostPath": "/nvme"}, "pfs": {"claimName": "pfs"}},
            "recovery": {
                "rules": [
                    {
                        "name": "spike",
                        "onSignals": ["LossSpike"],
                        "action": "Rollback",
                        "rollback": rollback,
                    },
                ],
                "budgets": {"maxRollbacks": 2, "cooldownSeconds": 0},
            },
        }
    )


def failed_pod(rank: int, message: str) -> PodFacts:
    """The pod as the operator's pod watch reads it from the API server's JSON."""
    facts = pod_facts(
        {
            "metadata": {
                "name": f"job-a1-{rank}",
                "labels": {JOB_LABEL: "job", ATTEMPT_LABEL: "1", RANK_LABEL: str(rank)},
            },
            "spec": {"nodeName": NODES[rank]},
            "status": {
                "phase": "Failed",
                "podIP": f"10.0.0.{rank + 2}",
                "containerStatuses": [
                    {
                        "state": {
                            "terminated": {
                                "exitCode": 1,
                                "reason": "Error",
                                "message": message,
                                "finishedAt": "2026-11-29T10:00:01Z",
                            }
                        }
                    }
                ],
            },
        }
    )
    assert facts is not None
    return facts


def rollback_from(message: str, scrapes: tuple[ScrapeResult, ...]) -> tuple[Transition, Transition]:
    """Today's operator, from a trip of attempt 1 reported by `message` and the pods'
    statuses `scrapes`, through the rollback to the relaunch: (the stop, the relaunch)."""
    spec = skew_spec()
    status = StableTrainingJobStatus(
        phase=Phase.RUNNING, attempt=1, directives_generation=2, step=132
    )

    def world(now: StableTrainingJobStatus, **changes: Any) -> World:
        return World(**{
            "now": datetime(2026, 11, 29, 10, 0, 2, tzinfo=UTC), "job": "job", "spec": spec,
            "generation": 1, "pods": (), "ledger": PolicyLedger.from_job_status(now),
            "previous_nodes": NODES, **changes,
        })  # fmt: skip

    pods = tuple(failed_pod(rank, message) for rank in (0, 1))
    stop = advance(status, world(status, pods=pods, scrapes=scrapes))
    planning = advance(stop.status, world(stop.status))
    relaunching = advance(planning.status, world(planning.status))
    return stop, advance(relaunching.status, world(relaunching.status))


def declared_keys_only(value: Any, schema: dict[str, Any], node: dict[str, Any]) -> list[str]:
    """Keys of `value` that the JSON schema `node` (of `schema`) does not declare: what an
    agent refuses, since every agent refuses unknown fields of its directives."""
    if "$ref" in node:
        return declared_keys_only(value, schema, schema["$defs"][node["$ref"].split("/")[-1]])
    for branch in node.get("anyOf", ()):
        if branch.get("type") != "null" and value is not None:
            return declared_keys_only(value, schema, branch)
    unknown: list[str] = []
    if isinstance(value, dict):
        properties = node.get("properties", {})
        for key, item in value.items():
            if key not in properties:
                unknown.append(key)
            else:
                unknown += [f"{key}.{k}" for k in declared_keys_only(item, schema, properties[key])]
    elif isinstance(value, list) and "items" in node:
        for item in value:
            unknown += declared_keys_only(item, schema, node["items"])
    return unknown


@pytest.mark.parametrize("agent", OLDER_AGENTS)
def test_an_older_agent_and_todays_operator_understand_each_other(
    agent: str, hostile_agent: HostileAgent
) -> None:
    """A rolling operator upgrade with running jobs. Before: the operator read an older
    agent's status and trip report, but every directive it wrote carried all of its fields,
    saveRequest among them, which an agent older than that field refuses: the relaunched
    pods of the rollback could not start. Now: the status (over HTTP, through the scraper)
    and the trip report (from the pod's JSON, through the pod watch's parser) are read and
    acted on, and the directives of the rollback they cause use only fields that agent
    knows."""
    recorded = SKEW / agent
    url = hostile_agent.serve(agent, (recorded / "status.json").read_bytes())
    results, _ = scrape_round([ScrapeTarget(f"job-a1-{rank}", url, 1) for rank in (0, 1)])
    scrapes = tuple(results.values())
    assert all(r.status is not None and r.error is None for r in scrapes), scrapes
    message = (recorded / "termination-message.json").read_text().strip()

    stop, relaunch = rollback_from(message, scrapes)

    assert stop.decision is not None
    assert (stop.decision.action, stop.decision.signal) == (Action.ROLLBACK, "LossSpike")
    assert relaunch.launch is not None
    directives = relaunch.launch.directives
    assert (directives.attempt, directives.resume_step) == (2, 110), "from the old inventory"
    wire = json.loads(directives.to_json(for_new_pods=True))  # as the new pods' ConfigMap
    schema = json.loads((recorded / "directives.schema.json").read_text())
    print(f"\n{agent}: trip and status read, rollback to step {directives.resume_step}; "
          f"the relaunch's directives: {sorted(wire)}")  # fmt: skip
    assert declared_keys_only(wire, schema, schema) == []


def newer(value: dict[str, Any]) -> dict[str, Any]:
    """`value` as an agent one release newer sends it: an optional field more at every level."""
    grown = {**value, "fieldOfANewerAgent": {"any": ["shape"]}}
    for key, item in value.items():
        if isinstance(item, dict):
            grown[key] = newer(item)
        elif isinstance(item, list) and item and isinstance(item[0], dict):
            grown[key] = [newer(entry) for entry in item]
    return grown


def test_an_agent_one_optional_field_newer_is_read(hostile_agent: HostileAgent) -> None:
    """Before: the contract models refused unknown fields, so an agent one optional field
    newer than the operator had every status scrape Malformed and its trip report read as
    an invalid one (a worker failure without a reason). Now: what an agent reports is read
    with the fields the operator knows; the rest is ignored."""
    recorded = SKEW / "agent-e09edf5"
    status = newer(json.loads((recorded / "status.json").read_text()))
    report = newer(json.loads((recorded / "termination-message.json").read_text()))
    url = hostile_agent.serve("newer", json.dumps(status).encode())
    results, _ = scrape_round([ScrapeTarget("job-a1-0", url, 1)])
    (result,) = results.values()
    ack = parse_directive_ack(json.dumps(newer({"appliedGeneration": 3, "message": "ok"})))

    facts = failed_pod(0, json.dumps(report))

    assert result.error is None, result.detail
    assert result.status is not None
    assert result.status.inventory[0].pfs.verified
    assert facts.trip is not None
    assert facts.trip.signal == "LossSpike"
    assert ack.applied_generation == 3
