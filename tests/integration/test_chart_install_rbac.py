"""`helm install` into the real control plane, then the chart's ServiceAccount, with a token
from the TokenRequest API (never the admin's certificate), asks and acts: it can make every
call the operator makes for a job (operator/stabletrain_operator/kube.py and kopf's), it
can never list or watch Secrets (it reads its token Secret back by name, which RBAC cannot
narrow further), reaches no Secret, pod or job outside the namespaces it serves, and cannot
widen its own permissions.

Two releases: one namespaced (two watched namespaces, Roles only) and one cluster-wide with
HA peering (its kopf peering object comes from a post-install hook, which also proves the
release can create an object of a CRD it installs itself).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config, watch

from stabletrain_contract.channel import new_token
from stabletrain_contract.directives import SkipRange
from stabletrain_contract.env import TOKEN_SECRET_KEY
from stabletrain_operator import naming, pods
from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.apiserver import from_kubeconfig
from stabletrain_operator.kube import Kube
from stabletrain_operator.tenancy.network_policy import NetworkSettings, build_network_policy
from support.chart import CHART, helm
from support.controlplane import ControlPlane
from support.serviceaccount import ServiceAccountClient, service_account_kubeconfig

REPO = CHART.parents[1]
JOB_MANIFEST = REPO / "examples" / "manifests" / "minimal.yaml"
JOBS = "stabletrainingjobs.stabletrain.dev"
FORBIDDEN = "Forbidden"
Manifest = dict[str, Any]


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    watched: tuple[str, ...]
    """Empty for a cluster-wide release."""
    other: str
    """A namespace the release does not serve (cluster-wide: one it serves like any other)."""
    account: ServiceAccountClient

    @property
    def fullname(self) -> str:
        return f"{self.name}-stabletrain"


def kubectl(
    plane: ControlPlane, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        plane.kubectl(*args), input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def create_namespaces(core: client.CoreV1Api, count: int) -> list[str]:
    names = [f"t-rbac-{uuid.uuid4().hex[:8]}" for _ in range(count)]
    for name in names:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # Pods need their namespace's `default` ServiceAccount, made by kube-controller-manager.
    for name in names:
        deadline = time.monotonic() + 30
        while not core.list_namespaced_service_account(name).items:
            assert time.monotonic() < deadline, f"no default ServiceAccount in {name}"
            time.sleep(0.1)
    return names


@contextlib.contextmanager
def installed(
    plane: ControlPlane,
    api_client: client.ApiClient,
    workdir: Path,
    sets: list[str],
    watched_count: int,
) -> Iterator[Release]:
    """A release in fresh namespaces; uninstalled and the namespaces deleted on any exit."""
    core = client.CoreV1Api(api_client)
    namespace, other, *watched = create_namespaces(core, 2 + watched_count)
    name = f"r{uuid.uuid4().hex[:6]}"
    env = plane.env()
    for kind in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{kind}_HOME"] = str(workdir / f"helm-{kind.lower()}")
    if watched:
        sets = [*sets, f"watchNamespaces={{{','.join(watched)}}}"]
    set_args = [arg for assignment in sets for arg in ("--set", assignment)]
    try:
        done = helm("install", name, str(CHART), "--namespace", namespace, *set_args, env=env)
        assert done.returncode == 0, done.stderr
        assert "STATUS: deployed" in done.stdout, done.stdout
        account = service_account_kubeconfig(
            plane, namespace, f"{name}-stabletrain", workdir / f"{name}.kubeconfig"
        )
        yield Release(name, namespace, tuple(watched), other, account)
    finally:
        helm("uninstall", name, "--namespace", namespace, "--wait", env=env)
        for ns in (namespace, other, *watched):
            core.delete_namespace(ns)


@pytest.fixture(scope="module")
def namespaced(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    with installed(control_plane, api_client, tmp_path_factory.mktemp("ns"), [], 2) as release:
        yield release


@pytest.fixture(scope="module")
def clusterwide(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    sets = ["operator.replicas=2", "operator.peering.enabled=true"]
    with installed(control_plane, api_client, tmp_path_factory.mktemp("cw"), sets, 0) as release:
        yield release


def get_json(plane: ControlPlane, *args: str) -> Manifest:
    done = kubectl(plane, "get", *args, "-o", "json")
    assert done.returncode == 0, done.stderr
    found: Manifest = json.loads(done.stdout)
    return found


def create_job(plane: ControlPlane, namespace: str) -> Manifest:
    """A StableTrainingJob made by a user (the admin), as the operator would find it."""
    job = yaml.safe_load(JOB_MANIFEST.read_text())
    job["metadata"] = {"name": f"job-{uuid.uuid4().hex[:6]}", "namespace": namespace}
    done = kubectl(plane, "create", "-o", "json", "-f", "-", stdin=json.dumps(job))
    assert done.returncode == 0, done.stderr
    created: Manifest = json.loads(done.stdout)
    return created


def owned_by(job: Manifest, kind: str, name: str, body: Manifest) -> Manifest:
    """An object the way the operator makes it: owned by the job, blocking its deletion."""
    meta = job["metadata"]
    owner = {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    metadata = {
        "name": name,
        "namespace": meta["namespace"],
        "labels": {"stabletrain.dev/job": meta["name"]},
        "ownerReferences": [owner],
    }
    return {"apiVersion": "v1", "kind": kind, "metadata": metadata, **body}


def worker_pod(job: Manifest, name: str) -> Manifest:
    return owned_by(
        job,
        "Pod",
        name,
        {
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "trainer", "image": "stabletrain/tiny-gpt:dev"}],
            }
        },
    )


def as_account(release: Release, *args: str, stdin: str | None = None) -> str:
    """Runs kubectl as the ServiceAccount; returns stdout, fails the test on an error."""
    done = release.account.run(*args, stdin=stdin)
    assert done.returncode == 0, f"{release.account.username}: kubectl {args}: {done.stderr}"
    return done.stdout


def refused(release: Release, *args: str, stdin: str | None = None) -> str:
    """Runs kubectl as the ServiceAccount and requires the API server to say Forbidden."""
    done = release.account.run(*args, stdin=stdin)
    assert done.returncode != 0, f"{release.account.username} was allowed: kubectl {args}"
    assert FORBIDDEN in done.stderr, done.stderr
    return done.stderr


# --- the namespaced release ---------------------------------------------------------------


def test_helm_install_creates_the_operator_deployment(
    control_plane: ControlPlane, namespaced: Release
) -> None:
    deployment = get_json(
        control_plane, "deployment", namespaced.fullname, "-n", namespaced.namespace
    )
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == namespaced.account.name
    args = pod["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace=")] == [
        f"--namespace={ns}" for ns in namespaced.watched
    ]
    # The stabletrain CRD came with the release (crds/) or was there already.
    get_json(control_plane, "crd", JOBS)
    for ns in namespaced.watched:
        get_json(control_plane, "role", namespaced.fullname, "-n", ns)
        get_json(control_plane, "rolebinding", namespaced.fullname, "-n", ns)
    missing = kubectl(control_plane, "get", "clusterrole", namespaced.fullname)
    assert "NotFound" in missing.stderr


NEEDED = [
    ("list", JOBS, ""),
    ("watch", JOBS, ""),
    ("patch", JOBS, ""),
    ("patch", JOBS, "status"),
    ("update", JOBS, "finalizers"),
    ("create", "pods", ""),
    ("delete", "pods", ""),
    ("patch", "pods", ""),  # a relaunch in place relabels the pods it keeps
    ("list", "pods", ""),
    ("watch", "pods", ""),
    ("create", "services", ""),
    ("get", "configmaps", ""),
    ("create", "configmaps", ""),
    ("update", "configmaps", ""),
    ("create", "secrets", ""),
    ("get", "secrets", ""),
    ("create", "events", ""),
]
NOT_NEEDED = [
    ("list", "secrets", ""),
    ("watch", "secrets", ""),
    ("update", "secrets", ""),
    ("delete", "secrets", ""),
    ("delete", "configmaps", ""),
    ("delete", "services", ""),
    ("delete", JOBS, ""),
    ("create", JOBS, ""),
    ("create", "pods", "exec"),
    ("create", "pods", "portforward"),
    ("create", "serviceaccounts", "token"),
    ("create", "roles.rbac.authorization.k8s.io", ""),
    ("create", "rolebindings.rbac.authorization.k8s.io", ""),
    ("update", "deployments.apps", ""),
]


def test_can_i_everything_the_operator_needs_in_every_watched_namespace(
    namespaced: Release,
) -> None:
    for ns in namespaced.watched:
        denied = [
            (verb, resource, sub)
            for verb, resource, sub in NEEDED
            if not namespaced.account.can_i(verb, resource, ns, sub)
        ]
        assert denied == [], ns


def test_can_i_nothing_else(namespaced: Release) -> None:
    account = namespaced.account
    allowed = [
        (verb, resource, sub, ns)
        for ns in (*namespaced.watched, namespaced.namespace)
        for verb, resource, sub in NOT_NEEDED
        if account.can_i(verb, resource, ns, sub)
    ]
    assert allowed == []
    outside = [
        (verb, resource)
        for verb, resource, sub in NEEDED
        if account.can_i(verb, resource, namespaced.other, sub)
        or account.can_i(verb, resource, namespaced.namespace, sub)
        or account.can_i(verb, resource, None, sub)
    ]
    assert outside == [], "a namespaced release grants nothing outside its namespaces"
    for verb, resource in [
        ("list", "nodes"),
        ("list", "namespaces"),
        ("list", "customresourcedefinitions"),
    ]:
        assert not account.can_i(verb, resource)


def test_the_operators_own_api_calls_succeed_with_the_service_account_token(
    control_plane: ControlPlane, namespaced: Release
) -> None:
    """The operator's Kube client and object builders, run as the ServiceAccount: every
    call of a launch, a status write, an Event and a rollback's pod deletion goes through."""
    ns = namespaced.watched[0]
    name = create_job(control_plane, ns)["metadata"]["name"]
    api: Any = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(namespaced.account.kubeconfig)
    )
    try:
        kube = Kube(from_kubeconfig(namespaced.account.kubeconfig))
        job = kube.get_job(ns, name)
        assert job is not None
        ref = pods.JobRef(name, ns, job["metadata"]["uid"])
        spec = StableTrainingJobSpec.model_validate(job["spec"])
        # kopf: list and watch jobs and the job's pods, keep progress and its finalizer.
        custom: Any = client.CustomObjectsApi(api)
        core: Any = client.CoreV1Api(api)
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        assert [j["metadata"]["name"] for j in listed["items"]] == [name]
        pod_watch: Any = watch.Watch()  # type: ignore[no-untyped-call]
        selector = naming.job_selector(name)
        for _ in pod_watch.stream(
            core.list_namespaced_pod, ns, label_selector=selector, timeout_seconds=1
        ):
            pass
        annotations = {f"{GROUP}/last-handled-configuration": "{}"}
        kopf_patch = {"metadata": {"finalizers": [f"{GROUP}/operator"], "annotations": annotations}}
        custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, kopf_patch)
        # ensure_base: the token Secret, the headless Service and the job's NetworkPolicy
        # (a 409 reads the object back to check its owner), then the token read back.
        token = new_token()
        assert kube.create(pods.build_token_secret(ref, token, checkpoint_key=new_token()))
        assert not kube.create(pods.build_token_secret(ref, new_token(), new_token()))  # 409
        assert kube.create(pods.build_service(ref))
        assert not kube.create(pods.build_service(ref))
        policy = build_network_policy(ref, pods.agent_port(), NetworkSettings())
        kube.create_or_update(policy, "spec")
        peers = NetworkSettings(agent_peers=({"podSelector": {}},))
        kube.create_or_update(build_network_policy(ref, pods.agent_port(), peers), "spec")
        assert kube.secret_value(ns, naming.token_secret(name), TOKEN_SECRET_KEY, ref.uid) == token
        # launch: the skip-list spill (created, then replaced as it grows), a dry run of a
        # pod, and the pods.
        kube.create_or_update(pods.build_skip_ranges_config_map(ref, []), "data")
        longer = pods.build_skip_ranges_config_map(ref, [SkipRange(first=1, last=2)])
        kube.create_or_update(longer, "data")
        assert kube.config_map_data(ns, naming.skip_ranges_config_map(name), ref.uid) is not None
        assert kube.dry_run_create(pods.build_pod(spec, ref, 1, 0)) is None
        for rank in range(spec.workers.nodes):
            assert kube.create(pods.build_pod(spec, ref, 1, rank, previous_node="node-a"))
        assert not kube.create(pods.build_pod(spec, ref, 1, 0))
        assert len(kube.list_pods(ns, naming.job_selector(name))) == spec.workers.nodes
        # The status write (fenced by resourceVersion) and the Event of the decision.
        job = kube.get_job(ns, name)
        assert job is not None
        version = job["metadata"]["resourceVersion"]
        written = kube.write_status(ns, name, version, {"phase": "Stopping", "attempt": 1})
        assert written["status"]["phase"] == "Stopping"
        kube.event(written, "Normal", "Planned", "RBAC check")
        # Stopping: every pod of the attempt deleted, then force-deleted.
        for rank in range(spec.workers.nodes):
            kube.delete_pod(ns, naming.pod_name(name, 1, rank), force=False)
            kube.delete_pod(ns, naming.pod_name(name, 1, rank), force=True)
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name, {"metadata": {"finalizers": None}}
        )
    finally:
        api.close()
    selector = f"involvedObject.name={name}"
    events = get_json(control_plane, "events", "-n", ns, "--field-selector", selector)
    assert [e["reason"] for e in events["items"]] == ["Planned"]
    # Nothing beyond: it cannot delete what garbage collection removes with the job.
    refused(namespaced, "delete", "secret", naming.token_secret(name), "-n", ns)
    refused(namespaced, "delete", "configmap", naming.skip_ranges_config_map(name), "-n", ns)
    refused(namespaced, "delete", "service", naming.service_name(name), "-n", ns)


def test_unrelated_secrets_and_other_namespaces_are_out_of_reach(
    control_plane: ControlPlane, namespaced: Release
) -> None:
    watched, other = namespaced.watched[0], namespaced.other
    for ns in (watched, other, namespaced.namespace):
        created = kubectl(
            control_plane, "create", "secret", "generic", "db-password", "-n", ns,
            "--from-literal=password=hunter2",
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        # Secrets can never be discovered, in any namespace.
        refused(namespaced, "get", "secrets", "-n", ns)
        refused(namespaced, "get", "secrets", "-n", ns, "--watch", "--request-timeout=5s")
    refused(namespaced, "get", "secrets", "--all-namespaces")
    # Outside the served namespaces (its own included), not even a known name is readable.
    for ns in (other, namespaced.namespace):
        message = refused(namespaced, "get", "secret", "db-password", "-n", ns)
        assert "hunter2" not in message
    # Inside a served namespace a known name is readable: the token read-back needs get,
    # and RBAC cannot narrow get to the token Secrets (docs/operations.md says so).
    assert namespaced.account.can_i("get", "secrets", watched)
    # Pods and jobs of a namespace it does not serve.
    job = create_job(control_plane, other)
    admin_pod = worker_pod(job, "not-yours")
    created = kubectl(control_plane, "create", "-f", "-", stdin=json.dumps(admin_pod))
    assert created.returncode == 0, created.stderr
    refused(namespaced, "get", "pods", "-n", other)
    refused(namespaced, "delete", "pod", "not-yours", "-n", other, "--wait=false")
    refused(namespaced, "create", "-f", "-", stdin=json.dumps(worker_pod(job, "sneaky")))
    refused(namespaced, "get", JOBS, "-n", other)
    refused(
        namespaced,
        "patch",
        JOBS,
        job["metadata"]["name"],
        "-n",
        other,
        "--type=merge",
        "-p",
        '{"metadata": {"annotations": {"x": "y"}}}',
    )
    refused(namespaced, "get", JOBS, "--all-namespaces")
    refused(namespaced, "get", "pods", "-n", namespaced.namespace)
    # Nor can it grant itself more.
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "more", "namespace": watched},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    refused(namespaced, "create", "-f", "-", stdin=json.dumps(role))
    assert get_json(control_plane, "pod", "not-yours", "-n", other)["metadata"]["name"]


# --- the cluster-wide HA release ----------------------------------------------------------


def test_cluster_release_serves_every_namespace_but_cannot_discover_secrets(
    control_plane: ControlPlane, clusterwide: Release
) -> None:
    account = clusterwide.account
    for verb, resource, sub in NEEDED:
        assert account.can_i(verb, resource, None, sub), (verb, resource, sub)
    assert account.can_i("watch", "customresourcedefinitions")
    for verb in ("list", "watch"):
        assert not account.can_i(verb, "secrets"), verb
    assert not account.can_i("create", "customresourcedefinitions")
    assert not account.can_i("list", "namespaces")
    job = create_job(control_plane, clusterwide.other)
    listed = json.loads(as_account(clusterwide, "get", JOBS, "--all-namespaces", "-o", "json"))
    assert job["metadata"]["name"] in {item["metadata"]["name"] for item in listed["items"]}
    created = kubectl(
        control_plane,
        "create",
        "secret",
        "generic",
        "db-password",
        "-n",
        clusterwide.other,
        "--from-literal=password=hunter2",
    )
    assert created.returncode == 0, created.stderr
    refused(clusterwide, "get", "secrets", "-n", clusterwide.other)
    refused(clusterwide, "get", "secrets", "--all-namespaces")


def test_ha_peering_object_exists_and_only_it_can_be_touched(
    control_plane: ControlPlane, clusterwide: Release
) -> None:
    peering = get_json(control_plane, "clusterkopfpeering", clusterwide.fullname)
    assert peering["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    deployment = get_json(
        control_plane, "deployment", clusterwide.fullname, "-n", clusterwide.namespace
    )
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--peering={clusterwide.fullname}" in args
    # kopf's keep-alive: a merge patch of status on its own peering object.
    alive = {"status": {"op-1": {"priority": 7, "lifetime": 60, "lastseen": "2026-01-01T00:00:00"}}}
    as_account(
        clusterwide,
        "patch",
        "clusterkopfpeering",
        clusterwide.fullname,
        "--type=merge",
        "-p",
        json.dumps(alive),
    )
    listed = json.loads(as_account(clusterwide, "get", "clusterkopfpeerings", "-o", "json"))
    assert clusterwide.fullname in {item["metadata"]["name"] for item in listed["items"]}
    other = f"other-{uuid.uuid4().hex[:6]}"
    created = kubectl(
        control_plane,
        "create",
        "-f",
        "-",
        stdin=json.dumps(
            {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": other}}
        ),
    )
    assert created.returncode == 0, created.stderr
    try:
        refused(
            clusterwide,
            "patch",
            "clusterkopfpeering",
            other,
            "--type=merge",
            "-p",
            json.dumps(alive),
        )
        refused(clusterwide, "delete", "clusterkopfpeering", clusterwide.fullname)
    finally:
        kubectl(control_plane, "delete", "clusterkopfpeering", other)


def test_a_second_ha_release_uses_the_peering_crd_already_there(
    control_plane: ControlPlane,
    api_client: client.ApiClient,
    clusterwide: Release,
    tmp_path: Path,
) -> None:
    """The peering CRD is kept by (or was never owned by) another release: a second HA
    release must neither fail on it nor take it over."""
    before = get_json(control_plane, "crd", "clusterkopfpeerings.kopf.dev")["metadata"]
    sets = ["operator.replicas=2", "operator.peering.enabled=true"]
    with installed(control_plane, api_client, tmp_path, sets, 0) as second:
        get_json(control_plane, "clusterkopfpeering", second.fullname)
        after = get_json(control_plane, "crd", "clusterkopfpeerings.kopf.dev")["metadata"]
        assert after["uid"] == before["uid"]
        assert after.get("annotations") == before.get("annotations")
