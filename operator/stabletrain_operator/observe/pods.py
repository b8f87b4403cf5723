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

from stabletrain_agent.contract.base import ContractError
from stabletrain_agent.contract.completion import Completion, parse_completion
from stabletrain_agent.contract.restore import parse_restore_failure
from stabletrain_agent.contract.trip_report import TripReport, parse_termination_message
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
    trip, trip_error = _parse_trip(message, metadata.get("name", "?")) if terminated else (None, "")
    return PodFacts(
        name=str(metadata.get("name", "")),
        attempt=attempt,
        rank=rank,
        state=state,
        node=spec.get("nodeName"),
        ip=status.get("podIP"),
        deleting=deleting,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        reason=str(reason),
        message=str(message)[-MESSAGE_MAX:],
        trip=trip,
        trip_error=trip_error,
        finished_at=_time((terminated or {}).get("finishedAt")),
        restore_failure=parse_restore_failure(str(message)) if terminated else None,
        agent_port=_declared_agent_port(spec),
        node_silent=_marked_by_node_controller(spec, status),
        completion=parse_completion(str(message)) if terminated else None,
    )


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
