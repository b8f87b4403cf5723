"""The objects of one attempt: the worker pods, the headless Service, the directives
ConfigMap and the token Secret, built as plain dicts from the job's spec.

The user's container command stays `torchrun <script> ...`; everything torchrun needs from
the cluster arrives through torchrun's own `PET_<OPTION>` environment variables (torch
2.9's `torch.distributed.argparse_util.env` reads `PET_<DEST>` for every option that has no
value on the command line), so the operator never rewrites a user's command line and an
explicit flag in it still wins. `PET_LOCAL_ADDR` comes from the downward API (the pod IP),
so torchrun advertises an address other pods can reach rather than a hostname guess.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from stabletrain_contract import env
from stabletrain_contract.directives import Directives, SkipRange
from stabletrain_contract.supervisor import READY_HTTP_PATH, StartOrder
from stabletrain_operator import naming
from stabletrain_operator.api.constants import API_VERSION, KIND
from stabletrain_operator.api.quantity import quantity_bytes
from stabletrain_operator.api.spec import RestartMode, StableTrainingJobSpec
from stabletrain_operator.queue.admission import Placement

Json = dict[str, Any]

ROOT_VOLUME = "stabletrain-root"
ROOT_DIR = PurePosixPath("/stabletrain")
"""One emptyDir holds the mount points of everything the operator mounts, so the tiers and
the directives sit side by side under a directory the pod owns (a kubelet creates missing
mount points anywhere; the local node of the tests only inside a directory the pod owns)."""
DIRECTIVES_DIR = ROOT_DIR / "directives"
DIRECTIVES_PATH = DIRECTIVES_DIR / env.DIRECTIVES_FILE_KEY
LOCAL_VOLUME = "stabletrain-local"
PFS_VOLUME = "stabletrain-pfs"
MEMORY_VOLUME = "stabletrain-memory"
"""The memory tier: an emptyDir of medium Memory, so it lives exactly as long as the pod
(kept across a restart of the training processes inside it, gone with the pod) and its
pages count against the training container's memory limit."""
DIRECTIVES_VOLUME = "stabletrain-directives"
AGENT_PORT_NAME = naming.AGENT_PORT_NAME
LINEAGE_SUBDIR = "lineage"
PREVIOUS_NODE_WEIGHT = 50
"""Preferred (not required) node affinity: a relaunched rank goes back to the node whose
local tier holds its checkpoint when that node is still there, anywhere else otherwise."""
SUSPECT_NODE_WEIGHT = 100
"""Keeping away from a suspect node weighs more than going back to the previous one (the API
server refuses weights outside 1-100: 101 made every relaunch away from a lost node fail
with 422)."""
DEFAULT_GRACE_SECONDS = 30
SUPERVISOR_COMMAND = "stabletrain-supervisor"
"""The agent's console script that runs the training command in a pod restarted in place."""
READINESS_PERIOD_SECONDS = 1
"""The supervisor's readiness turns false the moment an attempt ends on its own: the
kubelet's status update is what wakes the operator, so it is probed every second."""
LOST_NODE_TOLERATION_SECONDS = {
    "node.kubernetes.io/not-ready": 15,
    "node.kubernetes.io/unreachable": 0,
}
"""How long a worker stays on a node the control plane marked lost, instead of Kubernetes'
default 300 s: no rank can progress without every other, so waiting idles the whole job.
Unreachable (the node stopped reporting for the node-monitor grace period, 50 s by default
since Kubernetes 1.32) evicts at once: the grace period was the wait, and a kubelet that
answers again within it never gets the taint. NotReady (a kubelet that still reports, but
an unhealthy node: PLEG, runtime or network plugin) gets 15 s, so a brief flap does not
restart the run."""


@dataclass
class _AgentPort:
    port: int = env.DEFAULT_AGENT_PORT


_AGENT = _AgentPort()
"""The port new training pods' agents serve on: the operator's --agent-port (the chart's
agent.port), set once at start-up. Scrapes use each pod's own declared port instead, so
pods created before a change stay reachable."""


def set_agent_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise ValueError(f"the agent port must be 1..65535, got {port}")
    _AGENT.port = port


def agent_port() -> int:
    return _AGENT.port


def grace_seconds(spec: StableTrainingJobSpec) -> int:
    """The workers' termination grace period (the template's, else the default)."""
    value = (spec.workers.template.get("spec") or {}).get("terminationGracePeriodSeconds")
    return value if isinstance(value, int) and value >= 0 else DEFAULT_GRACE_SECONDS


def _lost_node_tolerations(existing: list[Json]) -> list[Json]:
    """Ours for the lost-node taints the template does not tolerate itself."""
    own = {t.get("key") for t in existing}
    added = [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
        for key, seconds in LOST_NODE_TOLERATION_SECONDS.items()
        if key not in own
    ]  # fmt: skip
    return existing + added


@dataclass(frozen=True)
class JobRef:
    """Identity of the owning job, for names, namespaces and ownerReferences."""

    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> Json:
        """Garbage collection removes everything a job owns when the job is deleted."""
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self, name: str, labels: Mapping[str, str] | None = None) -> Json:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": {naming.JOB_LABEL: self.name, **(labels or {})},
            "ownerReferences": [self.owner_reference()],
        }


def _field(path: str) -> Json:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def _value(name: str, value: object) -> Json:
    return {"name": name, "value": str(value)}


def master_address(job: JobRef, attempt: int, master_pod: str | None) -> str:
    """DNS name of node rank 0's pod: the attempt's own, or the pod kept from an earlier
    attempt that runs rank 0 in place."""
    return naming.pod_dns_name(
        job.name, master_pod or naming.pod_name(job.name, attempt, 0), job.namespace
    )


def torchrun_env(
    spec: StableTrainingJobSpec,
    job: JobRef,
    attempt: int,
    rank: int,
    master_pod: str | None = None,
) -> list[Json]:
    """torchrun's settings as PET_* variables: nodes, ranks, the attempt's rendezvous."""
    workers = spec.workers
    rendezvous = workers.rendezvous
    master = master_address(job, attempt, master_pod)
    conf = f"join_timeout={rendezvous.timeout_seconds}"
    if rendezvous.backend == "c10d":
        # Rank 0 hosts the TCPStore: said outright instead of torchrun's hostname heuristic.
        conf += f",is_host={1 if rank == 0 else 0}"
    return [
        _value(env.PET_NNODES, workers.nodes),
        _value(env.PET_NPROC_PER_NODE, workers.processes_per_node),
        _value(env.PET_NODE_RANK, rank),
        _value(env.PET_RDZV_BACKEND, rendezvous.backend),
        _value(env.PET_RDZV_ENDPOINT, f"{master}:{rendezvous.port}"),
        _value(env.PET_RDZV_ID, naming.rendezvous_id(job.name, attempt)),
        _value(env.PET_RDZV_CONF, conf),
        _value(env.PET_MASTER_ADDR, master),
        _value(env.PET_MASTER_PORT, rendezvous.port),
        _value(env.PET_MAX_RESTARTS, 0),
        {"name": env.PET_LOCAL_ADDR, **_field("status.podIP")},
    ]


def checkpoint_env(spec: StableTrainingJobSpec) -> list[Json]:
    """spec.checkpoints' settings for the agent's CheckpointConfig.from_env: the manager
    saves and keeps what the spec says, and the script need not repeat any of it."""
    checkpoints = spec.checkpoints
    variables = [
        _value(env.CHECKPOINT_INTERVAL_STEPS, checkpoints.interval_steps),
        _value(env.LOCAL_RETENTION, checkpoints.local.retention),
        _value(env.PFS_RETENTION, checkpoints.pfs.retention),
        _value(env.SPIKE_MARKERS, checkpoints.spike_markers),
    ]
    if checkpoints.local.size_limit is not None:
        limit = quantity_bytes(checkpoints.local.size_limit)
        variables.append(_value(env.LOCAL_SIZE_LIMIT_BYTES, limit))
    variables.append(_value(env.MEMORY_INTERVAL_STEPS, checkpoints.memory.interval_steps))
    if checkpoints.memory.interval_steps:
        variables.append(_value(env.MEMORY_CHECKPOINT_DIR, env.DEFAULT_MEMORY_CHECKPOINT_DIR))
    return variables


def agent_env(spec: StableTrainingJobSpec, job: JobRef, attempt: int, rank: int) -> list[Json]:
    """The contract's variables (stabletrain_contract.env) for the trainer-agent."""
    token_ref = {
        "secretKeyRef": {"name": naming.token_secret(job.name), "key": env.TOKEN_SECRET_KEY}
    }
    checkpoint_key_ref = {
        "secretKeyRef": {
            "name": naming.token_secret(job.name),
            "key": env.CHECKPOINT_KEY_SECRET_KEY,
            "optional": True,  # a Secret made before signing has none: the job stays unsigned
        }
    }
    return [
        _value(env.JOB_NAME, job.name),
        _value(env.JOB_NAMESPACE, job.namespace),
        _value(env.ATTEMPT, attempt),
        {"name": env.NODE_NAME, **_field("spec.nodeName")},
        {"name": env.POD_NAME, **_field("metadata.name")},
        _value(env.NODE_RANK, rank),
        _value(env.NODES, spec.workers.nodes),
        _value(env.PROCESSES_PER_NODE, spec.workers.processes_per_node),
        _value(env.LOCAL_CHECKPOINT_DIR, env.DEFAULT_LOCAL_CHECKPOINT_DIR),
        _value(env.PFS_CHECKPOINT_DIR, env.DEFAULT_PFS_CHECKPOINT_DIR),
        _value(env.LINEAGE_DIR, env.DEFAULT_PFS_CHECKPOINT_DIR / LINEAGE_SUBDIR),
        *checkpoint_env(spec),
        _value(env.DIRECTIVES_PATH, DIRECTIVES_PATH),
        {"name": env.DIRECTIVES_TOKEN, "valueFrom": token_ref},
        {"name": env.CHECKPOINT_KEY, "valueFrom": checkpoint_key_ref},
        _value(env.AGENT_PORT, agent_port()),
        {"name": env.AGENT_BIND_ADDRESS, **_field("status.podIP")},
        _value(env.TERMINATION_MESSAGE_PATH, env.DEFAULT_TERMINATION_MESSAGE_PATH),
    ]


def _volumes(spec: StableTrainingJobSpec, job: JobRef, attempt: int) -> list[Json]:
    local = spec.checkpoints.local
    if local.host_path is not None:
        path = naming.local_tier_host_path(local.host_path, job.namespace, job.name)
        local_source: Json = {"hostPath": {"path": path, "type": "DirectoryOrCreate"}}
    else:
        local_source = copy.deepcopy(local.volume or {})
    return [
        {"name": ROOT_VOLUME, "emptyDir": {}},
        {"name": LOCAL_VOLUME, **local_source},
        {
            "name": PFS_VOLUME,
            "persistentVolumeClaim": {"claimName": spec.checkpoints.pfs.claim_name},
        },
        {
            "name": DIRECTIVES_VOLUME,
            "configMap": {"name": naming.directives_config_map(job.name, attempt)},
        },
        *_memory_volume(spec),
    ]


def _memory_volume(spec: StableTrainingJobSpec) -> list[Json]:
    if not spec.checkpoints.memory.interval_steps:
        return []
    return [{"name": MEMORY_VOLUME, "emptyDir": {"medium": "Memory"}}]


def _mounts(spec: StableTrainingJobSpec) -> list[Json]:
    pfs: Json = {"name": PFS_VOLUME, "mountPath": str(env.DEFAULT_PFS_CHECKPOINT_DIR)}
    if spec.checkpoints.pfs.sub_path:
        pfs["subPath"] = spec.checkpoints.pfs.sub_path
    return [
        {"name": ROOT_VOLUME, "mountPath": str(ROOT_DIR)},
        {"name": LOCAL_VOLUME, "mountPath": str(env.DEFAULT_LOCAL_CHECKPOINT_DIR)},
        pfs,
        {
            "name": DIRECTIVES_VOLUME,
            "mountPath": str(DIRECTIVES_DIR),
            "readOnly": True,
        },
        *(
            [{"name": MEMORY_VOLUME, "mountPath": str(env.DEFAULT_MEMORY_CHECKPOINT_DIR)}]
            if spec.checkpoints.memory.interval_steps
            else []
        ),
    ]


def _replace_by_name(existing: Sequence[Json], ours: Sequence[Json]) -> list[Json]:
    """The user's entries minus those we set, then ours: ours must win (ranks, fencing)."""
    taken = {entry["name"] for entry in ours}
    return [entry for entry in existing if entry.get("name") not in taken] + list(ours)


def supervised(spec: StableTrainingJobSpec) -> bool:
    """Whether the job's pods run under the supervisor (restart InPlace): only a container
    with its own `command` can be wrapped (an image's entrypoint is not known here)."""
    if spec.recovery.restart is not RestartMode.IN_PLACE:
        return False
    try:
        container = _training_container(
            copy.deepcopy(spec.workers.template["spec"]), spec.workers.container_name
        )
    except (KeyError, ValueError):
        return False
    command = container.get("command")
    return isinstance(command, list) and bool(command)


def pod_shape(spec: StableTrainingJobSpec) -> str:
    """Digest of what a pod is built from and its next attempt cannot change (workers, the
    tiers' volumes, the memory tier, the agent port, the warm start): a pod of another shape
    runs an outdated template, tiers or supervisor settings and is replaced, not restarted.
    The checkpoint interval, retentions, size limit and spike markers are left out: every
    attempt's directives carry them."""
    checkpoints = spec.checkpoints
    shaping = {
        "workers": spec.workers.model_dump(mode="json", by_alias=True),
        "local": checkpoints.local.model_dump(
            mode="json", by_alias=True, include={"host_path", "volume"}
        ),
        "pfs": checkpoints.pfs.model_dump(
            mode="json", by_alias=True, include={"claim_name", "sub_path"}
        ),
        "memory": checkpoints.memory.model_dump(mode="json", by_alias=True),
        "agentPort": agent_port(),
        "warmStart": spec.recovery.warm_start,
    }
    encoded = json.dumps(shaping, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def _supervise(container: Json, spec: StableTrainingJobSpec) -> None:
    """The container's command under the supervisor, which owns the agent port (the
    training agent moves behind it to 127.0.0.1) and answers the readiness probe."""
    container["command"] = [SUPERVISOR_COMMAND, "--", *container["command"]]
    container["env"] = _replace_by_name(
        container["env"],
        [
            _value(env.AGENT_LOCAL_PORT, agent_port() + 1),
            _value(env.GRACE_SECONDS, grace_seconds(spec)),
            _value(env.WARM_START, int(spec.recovery.warm_start)),
        ],
    )
    container["readinessProbe"] = {
        "httpGet": {"path": READY_HTTP_PATH, "port": AGENT_PORT_NAME},
        "periodSeconds": READINESS_PERIOD_SECONDS,
        "timeoutSeconds": 1,
        "successThreshold": 1,
        "failureThreshold": 1,
    }


def start_order(
    spec: StableTrainingJobSpec, job: JobRef, directives: Directives, master_pod: str
) -> StartOrder:
    """What a pod kept from an earlier attempt is told to run: the attempt's directives and
    rendezvous, as a new pod of the attempt would have them in its env."""
    master = master_address(job, directives.attempt, master_pod)
    return StartOrder(
        directives=directives,
        rendezvous_endpoint=f"{master}:{spec.workers.rendezvous.port}",
        rendezvous_id=naming.rendezvous_id(job.name, directives.attempt),
        master_addr=master,
        grace_seconds=grace_seconds(spec),
    )


def _training_container(pod_spec: Json, container_name: str | None) -> Json:
    containers: list[Json] = pod_spec["containers"]
    if container_name is None:
        return containers[0]
    for container in containers:
        if container.get("name") == container_name:
            return container
    raise ValueError(
        f"workers.containerName {container_name!r} names no container of the template "
        f"(containers: {', '.join(str(c.get('name')) for c in containers)})"
    )


def _node_preference(node: str) -> Json:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"weight": PREVIOUS_NODE_WEIGHT, "preference": term}


def _away_from(nodes: Sequence[str]) -> Json:
    """One NotIn requirement per node (ANDed): the API server allows exactly one value in a
    `metadata.name` field requirement, and refused two suspect nodes in one with 422."""
    return {
        "matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": [node]} for node in nodes
        ]
    }


def _keep_away(pod_spec: Json, nodes: Sequence[str], *, required: bool) -> None:
    """Node anti-affinity from the job's suspect nodes: required (added to every term the
    template requires, since terms are ORed) or preferred with a weight above the
    previous-node preference."""
    node_affinity = pod_spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    if not required:
        preferred = node_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
        preferred.append({"weight": SUSPECT_NODE_WEIGHT, "preference": _away_from(nodes)})
        return
    selector = node_affinity.setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
    )
    terms = selector.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), *_away_from(nodes)["matchFields"]]


def build_pod(
    spec: StableTrainingJobSpec,
    job: JobRef,
    attempt: int,
    rank: int,
    previous_node: str | None = None,
    *,
    avoid_nodes: Sequence[str] = (),
    avoid_required: bool = False,
    master_pod: str | None = None,
    under_supervisor: bool = True,
    placement: Placement | None = None,
) -> Json:
    """Pod `rank` of `attempt`: the user's template plus torchrun, agent, tiers, directives;
    under the supervisor when the job restarts in place (and `under_supervisor`: a pod that
    runs once, like the preflight's, never is); for a queued job the admitted flavors' node
    labels and tolerations. `master_pod` names node rank 0's pod when it is kept from an
    earlier attempt."""
    template = copy.deepcopy(spec.workers.template)
    template_meta: Json = template.get("metadata") or {}
    pod_spec: Json = template["spec"]
    name = naming.pod_name(job.name, attempt, rank)
    labels = {
        **(template_meta.get("labels") or {}),
        **naming.attempt_labels(job.name, attempt),
        naming.RANK_LABEL: str(rank),
    }
    in_place = under_supervisor and supervised(spec)
    if in_place:
        labels[naming.RESTART_LABEL] = naming.IN_PLACE
    metadata = job.metadata(name, labels)
    metadata["annotations"] = {
        **(template_meta.get("annotations") or {}),
        naming.POD_SHAPE_ANNOTATION: pod_shape(spec),
    }

    container = _training_container(pod_spec, spec.workers.container_name)
    container["env"] = _replace_by_name(
        container.get("env") or [],
        [
            *torchrun_env(spec, job, attempt, rank, master_pod),
            *agent_env(spec, job, attempt, rank),
        ],
    )
    if in_place:
        _supervise(container, spec)
    container["volumeMounts"] = _replace_by_name(container.get("volumeMounts") or [], _mounts(spec))
    port = {"name": AGENT_PORT_NAME, "containerPort": agent_port(), "protocol": "TCP"}
    container["ports"] = _replace_by_name(container.get("ports") or [], [port])
    container["terminationMessagePath"] = str(env.DEFAULT_TERMINATION_MESSAGE_PATH)
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"

    pod_spec["volumes"] = _replace_by_name(
        pod_spec.get("volumes") or [], _volumes(spec, job, attempt)
    )
    pod_spec["restartPolicy"] = "Never"
    # The agent needs no Kubernetes API; a token goes only to a template that asks for one.
    pod_spec.setdefault("automountServiceAccountToken", False)
    pod_spec["hostname"] = name
    pod_spec["subdomain"] = naming.service_name(job.name)
    pod_spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    pod_spec["tolerations"] = _lost_node_tolerations(list(pod_spec.get("tolerations") or []))
    if previous_node:
        affinity = pod_spec.setdefault("affinity", {})
        node_affinity = affinity.setdefault("nodeAffinity", {})
        preferred = node_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
        preferred.append(_node_preference(previous_node))
    if avoid_nodes:
        _keep_away(pod_spec, avoid_nodes, required=avoid_required)
    if placement is not None:
        placement.apply(pod_spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def build_service(job: JobRef) -> Json:
    """Headless, publishing not-ready pods: torchrun's rendezvous needs rank 0's name while
    the pods are still starting, long before anything could call them ready."""
    name = naming.service_name(job.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": job.metadata(name),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {naming.JOB_LABEL: job.name},
            "ports": [{"name": AGENT_PORT_NAME, "port": agent_port()}],
        },
    }


def build_directives_config_map(job: JobRef, directives: Directives) -> Json:
    """The attempt's initial directives, mounted read-only; written before its pods exist
    (the pods it creates are built from the same spec: their environment has the checkpoint
    settings; pods kept in place get the whole directives in their start order)."""
    name = naming.directives_config_map(job.name, directives.attempt)
    metadata = job.metadata(name, {naming.ATTEMPT_LABEL: str(directives.attempt)})
    metadata["annotations"] = {naming.DIRECTIVES_GENERATION_ANNOTATION: str(directives.generation)}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {env.DIRECTIVES_FILE_KEY: directives.to_json(for_new_pods=True)},
    }


SKIP_RANGES_KEY = "skipRanges.json"
"""Key of the spilled skip list in the ConfigMap named by status.skipRangesConfigMap."""


def build_skip_ranges_config_map(job: JobRef, ranges: Sequence[SkipRange]) -> Json:
    """The whole skip list once status can no longer hold it inline."""
    payload = json.dumps([r.model_dump(mode="json", by_alias=True) for r in ranges])
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": job.metadata(naming.skip_ranges_config_map(job.name)),
        "data": {SKIP_RANGES_KEY: payload},
    }


def build_token_secret(job: JobRef, token: str, checkpoint_key: str) -> Json:
    """The bearer token of the live-directive channel and the key that signs the job's
    checkpoints; pods read both through secretKeyRef. Owned by the job, so a job deleted
    and made again under its name gets a new key: its predecessor's checkpoints are not
    its own."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": job.metadata(naming.token_secret(job.name)),
        "type": "Opaque",
        "stringData": {env.TOKEN_SECRET_KEY: token, env.CHECKPOINT_KEY_SECRET_KEY: checkpoint_key},
    }


def agent_url(pod_ip: str, port: int | None = None) -> str:
    """Base URL of a pod's agent (local rank 0 serves /metrics and the status endpoint), at
    the port the pod declares (PodFacts.agent_port), else the operator's."""
    return f"http://{pod_ip}:{port or agent_port()}"
