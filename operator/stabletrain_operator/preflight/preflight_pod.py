"""The preflight pod of a Refuse-mode job: the worker template, one node, no training.

The facts exist only once the user's script has built its model and optimizer, so the only
way to know them before any worker pod runs is to run the script once: same template, same
tier mounts, STABLETRAIN_PREFLIGHT=1, and torchrun told it is alone (one node, its own
rendezvous on loopback). Guard.from_env then writes the facts as the termination message
and exits 0 before the first step. The pod has the job label (so it is listed with the
job and collected with it) but no attempt or rank label, so the worker index ignores it.
Its name carries the spec generation: a changed spec gets a fresh preflight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stabletrain_contract import env
from stabletrain_contract.base import ContractError
from stabletrain_contract.env import PREFLIGHT_ENV
from stabletrain_contract.preflight import parse_preflight_facts
from stabletrain_operator import naming, pods
from stabletrain_operator.api.constants import GROUP, Phase
from stabletrain_operator.api.spec import PreflightMode, StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.conditions.preflight_condition import PodOutcome, PreflightPodResult
from stabletrain_operator.kube import Kube
from stabletrain_operator.ownership import owned_by

Json = dict[str, Any]

PREFLIGHT_LABEL = f"{GROUP}/preflight"
"""Value: the job's name."""
LOOPBACK = "127.0.0.1"


def preflight_pod_name(job: str, generation: int | None) -> str:
    return f"{job}-preflight-g{generation or 0}"


def _alone(spec: StableTrainingJobSpec, name: str) -> dict[str, str]:
    """torchrun on one node that hosts its own rendezvous: the other pods do not exist."""
    port = spec.workers.rendezvous.port
    conf = f"join_timeout={spec.workers.rendezvous.timeout_seconds}"
    if spec.workers.rendezvous.backend == "c10d":
        conf += ",is_host=1"
    return {
        env.PET_NNODES: "1",
        env.PET_NODE_RANK: "0",
        env.PET_RDZV_ENDPOINT: f"{LOOPBACK}:{port}",
        env.PET_RDZV_ID: name,
        env.PET_RDZV_CONF: conf,
        env.PET_MASTER_ADDR: LOOPBACK,
        env.NODES: "1",
        env.NODE_RANK: "0",
        PREFLIGHT_ENV: "1",
    }


def build_preflight_pod(
    spec: StableTrainingJobSpec, job: pods.JobRef, generation: int | None
) -> Json:
    """The worker pod of rank 0, attempt 0, made into the preflight pod (no directives: the
    script must not resume or skip anything, and it takes no step)."""
    name = preflight_pod_name(job.name, generation)
    pod = pods.build_pod(spec, job, 0, 0, under_supervisor=False)
    labels = pod["metadata"]["labels"]
    labels.pop(naming.ATTEMPT_LABEL, None)
    labels.pop(naming.RANK_LABEL, None)
    labels[PREFLIGHT_LABEL] = job.name
    pod["metadata"]["name"] = name
    pod_spec = pod["spec"]
    pod_spec["hostname"] = name
    pod_spec["volumes"] = [
        v for v in pod_spec["volumes"] if v.get("name") != pods.DIRECTIVES_VOLUME
    ]
    container = next(
        c for c in pod_spec["containers"] if any(e["name"] == env.ATTEMPT for e in c["env"])
    )
    container["volumeMounts"] = [
        m for m in container["volumeMounts"] if m.get("name") != pods.DIRECTIVES_VOLUME
    ]
    overrides = _alone(spec, name)
    kept = [e for e in container["env"] if e["name"] not in overrides]
    kept = [e for e in kept if e["name"] != env.DIRECTIVES_PATH]
    container["env"] = kept + [{"name": k, "value": v} for k, v in overrides.items()]
    return pod


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if terminated:
            return dict(terminated)
    return None


def read_preflight_pod(pod: Mapping[str, Any]) -> PreflightPodResult:
    """What the pod says: still going, its facts, or why it gave none."""
    name = str((pod.get("metadata") or {}).get("name", ""))
    phase = (pod.get("status") or {}).get("phase")
    terminated = _terminated(pod)
    if phase not in ("Succeeded", "Failed") or terminated is None:
        if phase == "Failed":
            reason = (pod.get("status") or {}).get("reason") or "Failed"
            return PreflightPodResult(name, PodOutcome.FAILED, detail=str(reason))
        return PreflightPodResult(name, PodOutcome.PENDING)
    message = str(terminated.get("message") or "").strip()
    exit_code = terminated.get("exitCode")
    detail = f"{terminated.get('reason') or phase}, exit code {exit_code}"
    if phase == "Failed" or exit_code != 0:
        tail = f": {message[:200]}" if message else ""
        return PreflightPodResult(name, PodOutcome.FAILED, detail=detail + tail)
    if not message:
        return PreflightPodResult(
            name, PodOutcome.FAILED, detail=detail + ", no termination message"
        )
    try:
        facts = parse_preflight_facts(message)
    except ContractError as error:
        first = str(error).replace("\n", " ")[:300]
        return PreflightPodResult(name, PodOutcome.FAILED, detail=f"{detail}; {first}")
    return PreflightPodResult(name, PodOutcome.FACTS, facts=facts)


def needs_preflight_pod(spec: StableTrainingJobSpec, status: StableTrainingJobStatus) -> bool:
    """Only a Refuse-mode job that has not started its workers yet."""
    return (
        spec.preflight.mode is PreflightMode.REFUSE
        and status.phase is Phase.PENDING
        and not spec.suspend
    )


def ensure_preflight_pod(
    kube: Kube, job: pods.JobRef, spec: StableTrainingJobSpec, generation: int | None
) -> PreflightPodResult:
    """Read the generation's preflight pod, creating it when it does not exist (idempotent;
    a pod of that name the job does not control is never read: the create raises
    NotOwnedError)."""
    name = preflight_pod_name(job.name, generation)
    for pod in kube.list_pods(job.namespace, f"{PREFLIGHT_LABEL}={job.name}"):
        if pod["metadata"]["name"] == name and owned_by(pod, job.uid):
            return read_preflight_pod(pod)
    kube.create(build_preflight_pod(spec, job, generation))
    return PreflightPodResult(name, PodOutcome.PENDING)
