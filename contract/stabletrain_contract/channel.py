"""The agent's HTTP surface: live directives in, status out.

Live directives (ReduceLR, new thresholds) must act within seconds and without a restart;
a mounted ConfigMap refreshes only after about a minute, so the operator instead PUTs the
Directives JSON to the agent's HTTP server (local rank 0 of each pod, the port that also
serves /metrics). Every PUT carries `Authorization: Bearer <token>`, the token coming from
a per-job Secret injected as STABLETRAIN_DIRECTIVES_TOKEN; anyone else who can reach the
pod cannot change a run. Delivery is idempotent by generation: the agent applies a
directive only if its generation is newer than the one it holds and always answers with
the generation it has applied, so the operator can retry blindly until every pod reports
the generation it sent.

A PUT's HTTP status: 200 when applied now or already applied (a stale or equal
generation: the body says which); 400 when the body is not valid Directives JSON (the
message names the field); 401 for a missing or wrong bearer token; 409 for directives of
another attempt, a live change of resume_step (fencing, never retried) or a generation more
than GENERATION_ADVANCE_MAX ahead of the applied one; 411 and 413 for a body without a
length or over MAX_DIRECTIVES_BYTES.

The operator's own status GETs carry `Authorization: Bearer <status credential>`, a value
derived from the token that opens no PUT: only a GET carrying it counts as the checkpoint
hand-over of a process that ends (the guard answers until the operator itself has read its
newest inventory). Anyone else may still read the status; reading hands nothing over.

Every size is bounded, so that one pod cannot make the shared operator hold more than a
small, fixed amount for it: the status body (MAX_STATUS_BYTES), an acknowledgement
(MAX_ACK_BYTES) and every list and string inside them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from enum import StrEnum
from http import HTTPStatus

from pydantic import AwareDatetime, Field, ValidationError

from stabletrain_contract.base import AgentReport, ContractError, describe_errors
from stabletrain_contract.checkpoint.inventory import (
    INVENTORY_MAX,
    NODE_NAME_MAX,
    POD_NAME_MAX,
    CheckpointRecord,
)
from stabletrain_contract.detection import CUSTOM_SIGNALS_MAX
from stabletrain_contract.directives import (
    GENERATION_ADVANCE_MAX,
    GENERATION_MAX,
    Directives,
)
from stabletrain_contract.names import AGENT_SIGNALS, SIGNAL_NAME_MAX, AnomalyClass
from stabletrain_contract.preflight import PreflightFacts
from stabletrain_contract.supervisor import SupervisorReport
from stabletrain_contract.trip_report import EVIDENCE_MAX, TripReport

DIRECTIVES_HTTP_PATH = "/v1/directives"
"""PUT: replace the directives (Directives JSON body). GET is the status endpoint's job."""
STATUS_HTTP_PATH = "/v1/status"
"""GET: AgentStatus JSON. Open to any reader, like /metrics; the operator's reads present
the status credential, and only those count as the checkpoint hand-over."""
METRICS_HTTP_PATH = "/metrics"
AUTHORIZATION_HEADER = "Authorization"
BEARER_PREFIX = "Bearer "
MAX_DIRECTIVES_BYTES = 1024 * 1024
"""Bodies above this are refused (413) unread; skip lists spill long before that."""
MAX_STATUS_BYTES = 128 * 1024
"""The operator reads no more of a status body. The largest status the bounds below allow
(every list full, every string at its limit) is under this (a test builds it); a pod of a
real 1,000-rank job serves a few KiB (docs/operations.md, "Multi-tenant clusters")."""
MAX_ACK_BYTES = 8 * 1024
"""The operator reads no more of the answer to a PUT; an acknowledgement is a few hundred
bytes."""
ACK_MESSAGE_MAX = 1024
STATUS_CREDENTIAL_CONTEXT = b"stabletrain status read v1"


def new_token() -> str:
    """A fresh per-job token: 256 random bits, URL-safe so it travels in a header."""
    return secrets.token_urlsafe(32)


def bearer(token: str) -> str:
    """The Authorization header value for `token`."""
    return BEARER_PREFIX + token


def status_credential(token: str) -> str:
    """What the operator's status GETs present: HMAC-SHA256 of a fixed context under the
    job's token. It proves the caller holds the token without being the token, so a pod
    that answers a scrape learns nothing it could PUT directives with."""
    digest = hmac.new(token.encode(), STATUS_CREDENTIAL_CONTEXT, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def token_matches(authorization: str | None, expected_token: str) -> bool:
    """Constant-time check of an Authorization header against the job's token (or the
    status credential derived from it).

    Constant time so the token cannot be guessed byte by byte from response timings; an
    empty expected token never matches, so a pod started without its Secret stays closed.
    """
    if not authorization or not expected_token or not authorization.startswith(BEARER_PREFIX):
        return False
    offered = authorization[len(BEARER_PREFIX) :].encode()
    return hmac.compare_digest(offered, expected_token.encode())


class LiveOutcome(StrEnum):
    """What the agent did with a live directive."""

    APPLIED = "Applied"
    ALREADY_APPLIED = "AlreadyApplied"
    """Generation not newer than the applied one: nothing changed (idempotent retry)."""
    WRONG_ATTEMPT = "WrongAttempt"
    RESUME_STEP_CHANGED = "ResumeStepChanged"
    GENERATION_TOO_FAR = "GenerationTooFar"
    """More than GENERATION_ADVANCE_MAX ahead of the applied generation: the operator moves
    one decision at a time, so such a jump would only pin the pod out of its reach."""


def judge_live_directive(current: Directives, incoming: Directives) -> LiveOutcome:
    """The agent's decision on a PUT, shared so that both sides agree on the semantics.

    Fencing comes before the generation: a directive for another attempt is refused even
    if its generation is newer. The resume step is fixed for an attempt because the pod
    has already loaded that checkpoint; changing it needs a relaunch.
    """
    if incoming.attempt != current.attempt:
        return LiveOutcome.WRONG_ATTEMPT
    if incoming.generation <= current.generation:
        return LiveOutcome.ALREADY_APPLIED
    if incoming.generation - current.generation > GENERATION_ADVANCE_MAX:
        return LiveOutcome.GENERATION_TOO_FAR
    if incoming.resume_step != current.resume_step:
        return LiveOutcome.RESUME_STEP_CHANGED
    return LiveOutcome.APPLIED


OUTCOME_STATUS: dict[LiveOutcome, HTTPStatus] = {
    LiveOutcome.APPLIED: HTTPStatus.OK,
    LiveOutcome.ALREADY_APPLIED: HTTPStatus.OK,
    LiveOutcome.WRONG_ATTEMPT: HTTPStatus.CONFLICT,
    LiveOutcome.RESUME_STEP_CHANGED: HTTPStatus.CONFLICT,
    LiveOutcome.GENERATION_TOO_FAR: HTTPStatus.CONFLICT,
}


class DirectiveAck(AgentReport):
    """The agent's answer to every PUT (also to refused ones, for a useful log line)."""

    outcome: LiveOutcome | None = None
    """Null when the request was refused before it was judged (401, 400, 413)."""
    applied_generation: int = Field(ge=0, le=GENERATION_MAX)
    """Generation the agent runs with after this request."""
    message: str = Field(default="", max_length=ACK_MESSAGE_MAX)


class FindingReport(AgentReport):
    """One signal currently firing, as the status endpoint shows it."""

    signal: str = Field(max_length=SIGNAL_NAME_MAX)
    anomaly_class: AnomalyClass
    value: float | None = None
    threshold: float | None = None
    onset_step: int = Field(ge=0)
    consecutive: int = Field(ge=1)
    sustained: bool
    evidence: str = Field(default="", max_length=EVIDENCE_MAX)


PFS_MESSAGE_MAX = 1024
FRAME_MAX = 256
STATUS_FIRING_MAX = len(AGENT_SIGNALS) + CUSTOM_SIGNALS_MAX
"""Every signal the agent computes, firing at once."""
REJECTED_MAX = 16
COPY_PATH_MAX = 512
PROBLEM_MAX = 512


class ThreadPlace(StrEnum):
    """Where the training thread is, read from its Python stack when the status is served.

    A hang leaves every rank blocked, but not in the same place: the rank that stopped first
    sits in its own code (a data loader, a deadlock, a sleep), the others wait inside torch
    for it (a collective, or a backward pass whose gradients DDP all-reduces).
    """

    TORCH = "Torch"
    """Inside torch: a collective, a backward pass, a kernel launch or a device sync."""
    CHECKPOINT = "Checkpoint"
    """Inside the agent's checkpoint manager: a save or a restore, never a stall."""
    ELSEWHERE = "Elsewhere"
    """In the training script or a library it calls (data loading, I/O, a sleep)."""
    GONE = "Gone"
    """The training thread has ended (training finished, or it raised)."""


class RejectedCopy(AgentReport):
    """A checkpoint copy this pod found and refused: not signed with the job's key, damaged,
    or not what its path says. It is never restored; a restore moves it aside."""

    path: str = Field(max_length=COPY_PATH_MAX)
    """Where the pod found it (its tier's mount path in the container)."""
    problem: str = Field(max_length=PROBLEM_MAX)
    """Why it was refused."""
    quarantined_as: str | None = Field(default=None, max_length=COPY_PATH_MAX)
    """Its new, dot-prefixed name once a restore set it aside (scanners no longer see it);
    null while it stays where it was found."""


class Heartbeat(AgentReport):
    """One rank's progress, served off the training thread so that a hung loop cannot
    silence it: a rank blocked in a collective still answers, a dead process does not.

    Times are the agent's own clock; the operator only compares them with `updatedAt` of
    the same answer, so clock skew between nodes never fakes a stall.
    """

    rank: int = Field(ge=0)
    """Global rank of the process that serves (local rank 0 of the pod)."""
    started_at: AwareDatetime
    """When this process's agent started."""
    training_since: AwareDatetime | None = None
    """When this process began training: its checkpoint restore finished (or, with no
    checkpoint manager, its agent started). The start-up stall bound counts from here, so
    restore time never counts. Null from an agent older than this field: the operator then
    does not judge the process before its warm-up steps, as before."""
    steps_completed: int = Field(default=0, ge=0)
    """Steps this process completed since it started (0 while it restores and warms up)."""
    last_step: int | None = Field(default=None, ge=0)
    """Global step last completed; null before the first."""
    last_step_at: AwareDatetime | None = None
    """When it completed."""
    slowest_step_seconds: float | None = Field(default=None, ge=0.0)
    """Longest gap between two completed steps among the recent ones (saves included):
    what the default stall bound is sized from."""
    in_step: bool = False
    """True between two completed steps (the process has started training and not ended)."""
    place: ThreadPlace = ThreadPlace.ELSEWHERE
    frame: str = Field(default="", max_length=FRAME_MAX)
    """The training thread's innermost frame outside torch and the standard library
    (file:line function): where a rank that stopped first is stuck."""


class AgentStatus(AgentReport):
    """GET /v1/status of one pod's agent: what the operator copies into the job's status.

    Floats may be "NaN"/"Infinity" strings on the wire (a non-finite loss is news, not an
    encoding error); null means not measured yet.
    """

    attempt: int = Field(ge=0)
    node: str = Field(min_length=1, max_length=NODE_NAME_MAX)
    node_rank: int = Field(ge=0)
    pod: str | None = Field(default=None, min_length=1, max_length=POD_NAME_MAX)
    """The pod that answers: the inventory's memory copies are in its memory tier (null
    from an agent without one; its scan then lists none)."""
    updated_at: AwareDatetime
    step: int | None = Field(default=None, ge=0)
    loss: float | None = None
    loss_baseline: float | None = None
    grad_norm: float | None = None
    grad_norm_baseline: float | None = None
    lr_scale: float = Field(gt=0.0, le=1.0)
    tokens_per_second: float | None = None
    applied_generation: int = Field(ge=0, le=GENERATION_MAX)
    firing: tuple[FindingReport, ...] = Field(
        default=(), max_length=STATUS_FIRING_MAX, fail_fast=True
    )
    """Signals firing now, tripping or report-only; Alert and ReduceLR rules act on these."""
    inventory: tuple[CheckpointRecord, ...] = Field(
        default=(), max_length=INVENTORY_MAX, fail_fast=True
    )
    """Checkpoints this pod knows (the newest INVENTORY_MAX): the PFS copy, this node's
    local copy and this pod's memory snapshot."""
    pfs_available: bool | None = None
    """Whether this pod's last write to the PFS tier succeeded; null until it reports."""
    pfs_message: str = Field(default="", max_length=PFS_MESSAGE_MAX)
    """Why, when the PFS is not available (the error of the last write)."""
    replicating: tuple[int, ...] | None = Field(default=None, max_length=INVENTORY_MAX)
    """Steps of this node's copies this pod still has to write to the PFS (being copied or
    queued), oldest first: the copies a stop may wait for. Empty when it has none left to
    send, though the inventory may list local copies that never complete on the PFS (the
    other node's part was given up, the attempt fenced off); null from an agent older than
    this field, or without a PFS."""
    latest_trip: TripReport | None = None
    preflight: PreflightFacts | None = None
    """The run's stability facts, gathered at start-up; the operator's Preflight condition
    judges them."""
    heartbeat: Heartbeat | None = None
    """Progress of the serving rank; the operator decides Stalled from it."""
    saved_request: int = Field(default=0, ge=0)
    """The newest directives `saveRequest` this pod answered: its checkpoint is written
    and flushed to the PFS (or could not be, see savedStep)."""
    saved_step: int | None = Field(default=None, ge=0)
    """Step of the checkpoint saved for savedRequest; null when none could be saved (no
    checkpoint manager attached to the guard, or the save failed)."""
    rejected: tuple[RejectedCopy, ...] = Field(default=(), max_length=REJECTED_MAX, fail_fast=True)
    """Checkpoint copies this process refused, the newest REJECTED_MAX; the operator names
    each in a Warning Event. Empty from an agent older than this field."""
    supervisor: SupervisorReport | None = None
    """Added by the pod's supervisor (recovery.restart InPlace): the training processes it
    runs. When its `agentAnswered` is false no training agent answered, and the rest of this
    status is the supervisor's own (attempt, node, the checkpoints it scanned)."""


def parse_agent_status(payload: str | bytes) -> AgentStatus:
    """The operator side of the status endpoint; ContractError names each bad field."""
    try:
        return AgentStatus.model_validate_json(payload)
    except ValidationError as error:
        raise ContractError(describe_errors("agent status", error)) from None


def parse_directive_ack(payload: str | bytes) -> DirectiveAck:
    try:
        return DirectiveAck.model_validate_json(payload)
    except ValidationError as error:
        raise ContractError(describe_errors("directive acknowledgement", error)) from None
