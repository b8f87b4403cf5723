"""What the supervisor in a worker pod reports and which orders it takes.

With `spec.recovery.restart: InPlace` every worker pod runs its training command under a
supervisor (`python -m stabletrain_agent.supervisor -- torchrun ...`) that outlives the
training processes: a recovery stops them and starts the next attempt in the same pod
instead of deleting and recreating it. The supervisor owns the pod's agent port; it
answers the status endpoint with the training agent's status plus its own report (or, while
no training process answers, with what it knows itself) and takes two orders, each
authenticated with the job's bearer token like a live directive:

- stop: end the processes of an attempt (TERM, the grace period, KILL);
- start: run the named attempt with its directives and its rendezvous.

Orders are idempotent by attempt, so the operator repeats them blindly until the report
shows them carried out; an order for an attempt older than the one the supervisor runs is
refused (409), so a delayed request can never bring back a fenced-off attempt.

An attempt that ends on its own (a trip, a crash, a killed rank) turns the pod's
readiness probe (`READY_HTTP_PATH`) false: the kubelet's status update is the operator's
prompt to read the report, as a container's exit is without a supervisor.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from pydantic import AwareDatetime, Field, ValidationError

from stabletrain_contract.base import (
    AgentReport,
    ContractError,
    ContractModel,
    describe_errors,
)
from stabletrain_contract.directives import Directives

START_HTTP_PATH = "/v1/supervisor/start"
"""PUT a StartOrder: run that attempt (stopping an older one first)."""
STOP_HTTP_PATH = "/v1/supervisor/stop"
"""PUT a StopOrder: end the processes of that attempt (or an older one)."""
READY_HTTP_PATH = "/v1/ready"
"""GET: the readiness probe; 503 while an attempt has ended without being told to."""
MESSAGE_MAX = 4096
"""What the report keeps of an ended attempt's termination message or output: a kubelet
keeps 4096 bytes of a termination message."""
LEFTOVER_MAX = 16
"""Process ids listed of an attempt that would not die; more are counted, not listed."""
ENDPOINT_MAX = 512
RENDEZVOUS_ID_MAX = 253


class ProcessState(StrEnum):
    """Where the training processes of the supervisor's current attempt are."""

    RUNNING = "Running"
    """Started and not ended (the rendezvous, the restore and training are all in here)."""
    EXITED = "Exited"
    """Ended on their own: finished, tripped, crashed or killed from outside."""
    STOPPING = "Stopping"
    """Told to stop: TERM sent, waiting for the grace period before KILL."""
    STOPPED = "Stopped"
    """Ended because they were told to."""
    UNKILLABLE = "Unkillable"
    """Told to stop, KILLed, and still there after the bound (a process in uninterruptible
    sleep: a hung device or file system). Only replacing the pod gets rid of them."""
    IDLE = "Idle"
    """No attempt was ever started in this pod (the command could not be read)."""


ENDED_STATES = frozenset({ProcessState.EXITED, ProcessState.STOPPED})
"""States in which no process of the attempt is left."""


class SupervisorReport(AgentReport):
    """The supervisor's own part of a pod's status: the processes it runs."""

    attempt: int = Field(ge=0)
    """The attempt whose processes run, or ran last."""
    state: ProcessState
    started_at: AwareDatetime | None = None
    """When that attempt's processes were started."""
    ended_at: AwareDatetime | None = None
    """When they ended (or, Unkillable, when the supervisor gave up on them)."""
    exit_code: int | None = None
    """The launcher's exit code as a container's would read: 128 + n after signal n."""
    message: str = Field(default="", max_length=MESSAGE_MAX)
    """The ended attempt's termination message (a trip report, a restore failure, the
    completion) or, when it left none, the tail of its output."""
    attempts_started: int = Field(default=0, ge=0)
    """Attempts started in this pod, the first one included: 1 + its in-place restarts."""
    agent_answered: bool = False
    """Whether the training agent answered this status request (the numbers, firing
    signals and heartbeat of the status are then its; otherwise the supervisor's own)."""
    leftover_pids: tuple[int, ...] = Field(default=(), max_length=LEFTOVER_MAX)
    """Processes of an Unkillable attempt still there."""
    warm: bool = False
    """Whether the attempt was handed to a standby interpreter (imports already done)."""


class StartOrder(ContractModel):
    """Run `directives.attempt` in this pod, after stopping whatever runs."""

    directives: Directives
    """The attempt's initial directives, with the checkpoint settings its ConfigMap leaves
    to a new pod's environment (a kept pod's may be older)."""
    rendezvous_endpoint: str = Field(min_length=1, max_length=ENDPOINT_MAX)
    """torchrun's rendezvous endpoint (host:port) of the attempt: node rank 0's pod."""
    rendezvous_id: str = Field(min_length=1, max_length=RENDEZVOUS_ID_MAX)
    master_addr: str = Field(min_length=1, max_length=ENDPOINT_MAX)
    grace_seconds: float = Field(default=30.0, ge=0.0, le=3600.0)
    """How long an older attempt still running gets after TERM before KILL."""


class StopOrder(ContractModel):
    """End the processes of `attempt` (or of any older attempt the supervisor runs)."""

    attempt: int = Field(ge=0)
    grace_seconds: float = Field(default=30.0, ge=0.0, le=3600.0)
    """Time between TERM and KILL."""


class OrderAck(AgentReport):
    """The supervisor's answer to an order: its report after taking it, and why if not."""

    accepted: bool
    message: str = Field(default="", max_length=MESSAGE_MAX)
    report: SupervisorReport


_Model = TypeVar("_Model", bound=ContractModel)


def _parse(model: type[_Model], what: str, payload: str | bytes) -> _Model:
    try:
        return model.model_validate_json(payload)
    except ValidationError as error:
        raise ContractError(describe_errors(what, error)) from None


def parse_start_order(payload: str | bytes) -> StartOrder:
    return _parse(StartOrder, "start order", payload)


def parse_stop_order(payload: str | bytes) -> StopOrder:
    return _parse(StopOrder, "stop order", payload)


def parse_order_ack(payload: str | bytes) -> OrderAck:
    return _parse(OrderAck, "order answer", payload)
