"""Pod status as the kubelet reports it, computed from what the node knows about its containers.

Pure functions over plain data, so the rules (phase from restart policy and exits, the
Ready condition, lastState after a restart) are easy to read next to the kubelet's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from support.localnode.api import Json
from support.localnode.container import Exit

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass
class ContainerView:
    """What the status needs to know about one container."""

    name: str
    image: str
    running_since: str | None = None
    container_id: str = ""
    runs: int = 0
    exits: list[Exit] = field(default_factory=list)
    restarts_pending: bool = False
    waiting_reason: str = "ContainerCreating"
    waiting_message: str = ""
    probe_ready: bool | None = None
    """The readiness probe's verdict; None for a container without a readiness probe."""

    @property
    def ready(self) -> bool:
        """Running, and its readiness probe (if any) succeeding."""
        return self.running_since is not None and self.probe_ready is not False

    @property
    def finished(self) -> bool:
        """Exited and not to be started again."""
        return self.running_since is None and bool(self.exits) and not self.restarts_pending


def _terminated(exit_: Exit, container_id: str) -> Json:
    state: Json = {
        "exitCode": exit_.exit_code, "reason": exit_.reason, "startedAt": exit_.started_at,
        "finishedAt": exit_.finished_at, "containerID": container_id,
    }  # fmt: skip
    if exit_.message:
        state["message"] = exit_.message
    if exit_.signal is not None:
        state["signal"] = exit_.signal
    return {"terminated": state}


def container_status(view: ContainerView) -> Json:
    if view.running_since is not None:
        state: Json = {"running": {"startedAt": view.running_since}}
        last = _terminated(view.exits[-1], view.container_id) if view.exits else {}
    elif view.exits and not view.restarts_pending:
        state = _terminated(view.exits[-1], view.container_id)
        last = _terminated(view.exits[-2], view.container_id) if len(view.exits) > 1 else {}
    else:
        waiting: Json = {"reason": view.waiting_reason}
        if view.waiting_message:
            waiting["message"] = view.waiting_message
        state = {"waiting": waiting}
        last = _terminated(view.exits[-1], view.container_id) if view.exits else {}
    return {
        "name": view.name,
        "image": view.image,
        "imageID": "",
        "containerID": view.container_id,
        "ready": view.ready,
        "started": view.running_since is not None,
        "restartCount": max(0, view.runs - 1),
        "state": state,
        "lastState": last,
    }


def pod_phase(views: list[ContainerView]) -> str:
    if any(v.running_since is None and not v.exits for v in views):
        return "Pending"
    if not all(v.finished for v in views):
        return "Running"
    return "Succeeded" if all(v.exits[-1].exit_code == 0 for v in views) else "Failed"


def _condition(
    kind: str, true: bool, now: str, since: dict[str, tuple[str, str]], reason: str = ""
) -> Json:
    """A condition whose lastTransitionTime moves only when its status flips."""
    value = "True" if true else "False"
    previous = since.get(kind)
    if previous is None or previous[0] != value:
        since[kind] = (value, now)
    condition: Json = {"type": kind, "status": value, "lastTransitionTime": since[kind][1]}
    if reason:
        condition["reason"] = reason
    return condition


def pod_status(
    views: list[ContainerView],
    pod_ip: str,
    host_ip: str,
    start_time: str,
    now: str,
    *,
    since: dict[str, tuple[str, str]],
) -> Json:
    """The status document; `since` carries each condition's last transition between calls."""
    phase = pod_phase(views)
    ready = phase == "Running" and all(v.ready for v in views)
    not_ready = "" if ready else ("PodCompleted" if phase != "Running" else "ContainersNotReady")
    status: Json = {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [container_status(v) for v in views],
        "conditions": [
            _condition("PodReadyToStartContainers", bool(pod_ip), now, since),
            _condition("Initialized", True, now, since),
            _condition("ContainersReady", ready, now, since, not_ready),
            _condition("Ready", ready, now, since, not_ready),
        ],
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status
