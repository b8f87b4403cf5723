"""What a worker pod's status says, reduced to the facts the state machine decides on.

The trip report arrives as the container's termination message (torchrun exits 1 whatever
the worker's exit code, so the message is the channel). A message that does not parse is
kept as text and logged with what was expected: the pod still counts as failed, nothing is
dropped silently.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from stabletrain_contract.base import ContractError
from stabletrain_contract.completion import Completion, parse_completion
from stabletrain_contract.restore import parse_restore_failure
from stabletrain_contract.trip_report import TripReport, parse_termination_message
from stabletrain_operator import naming
from stabletrain_operator.observe.failure_cause import failure_cause

_log = logging.getLogger(__name__)

Json = Mapping[str, Any]
MESSAGE_MAX = 2048
"""The end of a termination message kept: a kubelet keeps at most 4096 bytes, and with
FallbackToLogsOnError the last 2048 bytes of the log, where the error is."""


class PodState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    GONE = "Gone"
    """Being deleted (deletionTimestamp set) without having finished."""


@dataclass(frozen=True)
class PodFacts:
    """One worker pod as the job's reconcile sees it."""

    name: str
    attempt: int
    rank: int
    state: PodState
    node: str | None
    ip: str | None
    deleting: bool
    exit_code: int | None = None
    reason: str = ""
    """Why it ended: OOMKilled, Evicted, NodeLost, Error, a container reason..."""
    message: str = ""
    trip: TripReport | None = None
    trip_error: str = ""
    """Set when the termination message looked like a report but did not parse."""
    finished_at: datetime | None = None
    """When its container ended (the kubelet's finishedAt, whole seconds)."""
    restore_failure: tuple[int, int] | None = None
    """(step, attempt) when the pod could not restore the step its directives named."""
    agent_port: int | None = None
    """The agent port the pod declares (its container port named st-agent)."""
    node_silent: bool = False
    """Its node stopped reporting: the node controller marked the pod not ready (see
    `_marked_by_node_controller`). No kubelet will confirm its deletion."""
    completion: Completion | None = None
    """The final step and loss its agent left when training ended without an error."""
    supervised: bool = False
    """Its training command runs under the supervisor: a recovery restarts it in place."""
    ready: bool | None = None
    """Its Ready condition (None: not reported yet). A supervised pod turns not ready when
    its attempt ended on its own: the prompt to read the supervisor's report."""
    shape: str = ""
    """The pod-shape digest it was built with (naming.POD_SHAPE_ANNOTATION)."""
    processes_ended: bool = False
    """Supervised, its container still running, and its supervisor reports that the
    attempt's processes ended (`state` then says how, as a container's end would)."""

    unschedulable: str | None = None
    """The scheduler's message while its PodScheduled condition is False (Unschedulable)."""
    created_at: datetime | None = None

    @property
    def container_running(self) -> bool:
        """Its container runs (a supervised pod between attempts included)."""
        return self.state is PodState.RUNNING or self.processes_ended

    @property
    def finished(self) -> bool:
        return self.state in (PodState.SUCCEEDED, PodState.FAILED)


def _declared_agent_port(spec: Json) -> int | None:
    """The containerPort the operator named st-agent when it built the pod."""
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == naming.AGENT_PORT_NAME and isinstance(
                port.get("containerPort"), int
            ):
                return int(port["containerPort"])
    return None


def _marked_by_node_controller(spec: Json, status: Json) -> bool:
    """Ready False while ContainersReady is still True: the mark the node controller puts on
    every pod of a node that went NotReady or Unknown. A kubelet that stops a container
    turns both False; the one other way to this pair, unmet readiness gates, is ruled out."""
    if spec.get("readinessGates"):
        return False
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return conditions.get("Ready") == "False" and conditions.get("ContainersReady") == "True"


def _unschedulable(status: Json) -> str | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "Unschedulable")
    return None


def _int_label(labels: Json, key: str) -> int | None:
    value = labels.get(key)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _terminated_state(status: Json) -> Json | None:
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        if "terminated" in state:
            terminated: Json = state["terminated"]
            return terminated
    return None


def _parse_trip(message: str, pod: str) -> tuple[TripReport | None, str]:
    text = message.strip()
    if not text.startswith("{"):
        return None, ""
    try:
        return parse_termination_message(text), ""
    except ContractError as error:
        _log.warning(
            "pod %s: termination message is not a trip report (expected the agent's "
            "TripReport JSON): %s", pod, error,
        )  # fmt: skip
        return None, str(error)


def _ready(status: Json) -> bool | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return None


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def pod_facts(pod: Json) -> PodFacts | None:
    """Facts of a worker pod, or None for a pod without the operator's labels."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    attempt = _int_label(labels, naming.ATTEMPT_LABEL)
    rank = _int_label(labels, naming.RANK_LABEL)
    if attempt is None or rank is None:
        return None
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    phase = status.get("phase") or "Pending"
    deleting = bool(metadata.get("deletionTimestamp"))
    terminated = _terminated_state(status)
    exit_code = terminated.get("exitCode") if terminated else None
    reason = (terminated or {}).get("reason") or status.get("reason") or ""
    message = (terminated or {}).get("message") or status.get("message") or ""
    if phase == "Succeeded":
        state = PodState.SUCCEEDED
    elif phase == "Failed":
        state = PodState.FAILED
    elif deleting:
        state = PodState.GONE
    elif phase == "Running":
        state = PodState.RUNNING
    else:
        state = PodState.PENDING
    name = str(metadata.get("name", ""))
    ended = (
        termination_facts(str(message), name)
        if terminated
        else {"message": str(message)[-MESSAGE_MAX:]}
    )
    return PodFacts(
        name=name,
        attempt=attempt,
        rank=rank,
        state=state,
        node=spec.get("nodeName"),
        ip=status.get("podIP"),
        deleting=deleting,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        reason=str(reason),
        finished_at=_time((terminated or {}).get("finishedAt")),
        agent_port=_declared_agent_port(spec),
        node_silent=_marked_by_node_controller(spec, status),
        supervised=labels.get(naming.RESTART_LABEL) == naming.IN_PLACE,
        ready=_ready(status),
        shape=str((metadata.get("annotations") or {}).get(naming.POD_SHAPE_ANNOTATION, "")),
        unschedulable=None if spec.get("nodeName") else _unschedulable(status),
        created_at=_time(metadata.get("creationTimestamp")),
        **ended,
    )


def termination_facts(message: str, pod: str) -> dict[str, Any]:
    """What an ended attempt's termination message says (a trip report, a restore failure,
    a completion, or only words): the same reading for a container's message and for what
    a supervisor reports of the processes it ran."""
    trip, trip_error = _parse_trip(message, pod)
    return {
        "message": message[-MESSAGE_MAX:],
        "trip": trip,
        "trip_error": trip_error,
        "restore_failure": parse_restore_failure(message),
        "completion": parse_completion(message),
    }


def failure_evidence(pod: PodFacts) -> str:
    """A sentence on why a pod ended without a trip report: crash, OOM, eviction, node loss."""
    if pod.state is PodState.GONE:
        silent = ", its node having stopped reporting" if pod.node_silent else ""
        return f"pod {pod.name} on node {pod.node} was deleted before it finished{silent}"
    what = pod.reason or "Error"
    code = f" with exit code {pod.exit_code}" if pod.exit_code is not None else ""
    if pod.trip is not None or not pod.message:
        return f"pod {pod.name} on node {pod.node} ended {what}{code}"
    cause = failure_cause(pod.message)
    if cause.lines or cause.exit_code is not None:
        return f"pod {pod.name} on node {pod.node} ended {what}: {cause.describe()}"
    return f"pod {pod.name} on node {pod.node} ended {what}{code}: {pod.message[:200]}"
