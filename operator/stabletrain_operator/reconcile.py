"""One reconcile tick of one job: gather the world, advance the machine, carry out its
transition.

Order is what makes a crash harmless: the transition's `launch` (idempotent creates) before
the status write, the status written once, then deletes, live directives and Events after it.
Events therefore never announce something the status does not hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

from stabletrain_contract.base import ContractError
from stabletrain_contract.channel import new_token, status_credential
from stabletrain_contract.directives import Directives, SkipRange, parse_directives
from stabletrain_contract.env import (
    CHECKPOINT_KEY_SECRET_KEY,
    DIRECTIVES_FILE_KEY,
    TOKEN_SECRET_KEY,
)
from stabletrain_contract.supervisor import StopOrder, SupervisorReport
from stabletrain_operator import metrics, naming, pods
from stabletrain_operator.api.constants import ConditionType, Phase, Reason
from stabletrain_operator.api.spec import RecoverySpec, StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.apiserver import ApiError
from stabletrain_operator.conditions.entries import condition
from stabletrain_operator.finite import non_finite_replaced
from stabletrain_operator.jobview import (
    JobView,
    Source,
    StatusWrite,
    identity,
    look_again_by,
    parse,
    source,
    write_needed,
)
from stabletrain_operator.kube import Kube, StaleStatusError, each
from stabletrain_operator.machine import Launch, Transition, World, advance
from stabletrain_operator.observe import rejected_copies
from stabletrain_operator.observe.pacing import FAST_INTERVAL_SECONDS, ScrapePacer
from stabletrain_operator.observe.pod_facts import PodFacts, PodState
from stabletrain_operator.observe.scrape import (
    KEEPALIVE_SECONDS,
    Scraper,
    ScrapeResult,
    ScrapeTarget,
    scrape_all,
)
from stabletrain_operator.observe.stall import RankProgress
from stabletrain_operator.observe.supervised import attempt_ended, with_reports
from stabletrain_operator.ownership import NotOwnedError
from stabletrain_operator.plan.merged_inventory import copies_in_flight
from stabletrain_operator.plan.sent_directives import checkpoint_settings
from stabletrain_operator.platform_policy.catalog import PolicyCatalog
from stabletrain_operator.platform_policy.effective import EffectivePolicy, effective_policy
from stabletrain_operator.pod_calls.directive_put import AgentUnreachableError, put_directives
from stabletrain_operator.pod_calls.supervisor_orders import Order, send_orders
from stabletrain_operator.policy import PolicyLedger
from stabletrain_operator.policy.action_kind import StatusCounter
from stabletrain_operator.policy.action_registry import kind_of
from stabletrain_operator.preflight.preflight_pod import ensure_preflight_pod, needs_preflight_pod
from stabletrain_operator.queue.api import KueueApi
from stabletrain_operator.queue.facts import WorkloadFacts
from stabletrain_operator.queue.sync import (
    QueuedJob,
    QueueMemory,
    carry_out,
    own_workload,
    read_admission,
)
from stabletrain_operator.queue.workload import queue_name
from stabletrain_operator.queue.workload_status import workload_writes
from stabletrain_operator.remediation import (
    NodeAction,
    NodeRemediation,
    NodeVerdict,
    NodeVotes,
    node_patch,
    tainted,
)
from stabletrain_operator.tenancy import invalid_spec
from stabletrain_operator.tenancy.hostnames import name_problems
from stabletrain_operator.tenancy.limits import TenancySettings
from stabletrain_operator.tenancy.network_policy import NetworkSettings, build_network_policy
from stabletrain_operator.tenancy.problems import SpecProblem
from stabletrain_operator.tenancy.spec_check import SpecGate, api_refusal, refuses_spec

_log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_SECONDS = 2.0
PUT_TIMEOUT_SECONDS = 2.0
SCRAPED_PHASES = frozenset({Phase.RUNNING, Phase.CONFIRMING})
"""Phases whose pods are scraped; also Stopping while its processes stop in place (their
supervisors report when they ended, with the checkpoints on their tiers)."""
SETTLE_SECONDS = 10.0
"""How long a stop keeps scraping the pods still running while one still sends a copy to
the PFS (plan/merged_inventory.copies_in_flight). A rank killed outright breaks the others'
collective: under gloo they end at once, their agents first finishing such copies and
answering until a scrape read the result (stabletrain_agent.guard.HAND_OVER_SECONDS); under
NCCL they hang with their agents answering. One scrape, at the decision, came before the
copies landed: the restart passed over the newest checkpoint, or found none verified on the
PFS and failed the job."""
SETTLE_PAUSE_SECONDS = 0.5
HELD_RECHECK_SECONDS = 30.0
"""How often a job held by an invalid spec ticks on its own: nothing changes until the spec
does, and a change of the job wakes its daemon at once."""
NAME_TAKEN_RETRY_SECONDS = 5.0
"""How often a job whose object's name another owner holds tries again."""
PREDECESSOR_RETRY_SECONDS = 1.0
"""How often a recreated job looks again for its predecessor's objects to be gone (garbage
collection removes them within seconds of the old job)."""
UNSIGNED_MESSAGE = (
    f"the job's Secret has no {CHECKPOINT_KEY_SECRET_KEY} (it was made before checkpoints were "
    "signed): this job's checkpoints are neither signed nor checked for a signature; a job "
    "created anew signs its own (docs/operations.md, Multi-tenant clusters)"
)


@dataclass
class JobMemory:
    """What one job's daemon keeps between ticks; all of it can be rebuilt after a restart."""

    token: str | None = None
    status_credential: str = ""
    """What the scrapes present (contract.channel.status_credential of the token)."""
    signed_checkpoints: bool = True
    """The job's Secret holds a checkpoint key (one made before signing does not)."""
    announced_rejections: dict[tuple[str, str], None] = field(default_factory=dict)
    """Refused checkpoint copies already named in an Event (observe/rejected_copies.py)."""
    nodes: dict[int, str] = field(default_factory=dict)
    """Node of each rank of the newest attempt seen running (the relaunch prefers them)."""
    seen: dict[str, int] = field(default_factory=dict)
    """Pods seen in the index, with their attempt, to notice one that vanished."""
    directives: dict[int, Directives] = field(default_factory=dict)
    last_scrape: float = 0.0
    close_eye: bool = True
    """Whether the last round asked for the fast interval: confirming, a pod of the attempt
    failed, an agent silent or firing (the pacer spaces the others)."""
    next_tick_at: float = 0.0
    """Monotonic time of the next tick the job needs when its world does not change."""
    base_ready: bool = False
    beats: dict[tuple[str, int], RankProgress] = field(default_factory=dict)
    """Newest heartbeat of each pod of the current attempt, kept while its agent is silent;
    by pod and attempt, so a pod restarted in place starts the next attempt without one."""
    view: JobView | None = None
    """The newest version of the job read or written (jobview.py)."""
    rejected_version: str | None = None
    """A version whose spec or status did not validate (logged once, not read again)."""
    progress_written_at: float = 0.0
    woken_at: float | None = None
    """When a watch event last asked for a tick (time.monotonic()), None for a tick on time."""
    skip_ranges: tuple[str, tuple[SkipRange, ...]] | None = None
    """The spilled skip list as last read from (or written to) its ConfigMap."""
    supervisors: dict[str, SupervisorReport] = field(default_factory=dict)
    """Newest report of each supervised pod's supervisor (scrapes and order answers)."""
    queue: QueueMemory = field(default_factory=QueueMemory)
    spec_gate: SpecGate = field(default_factory=SpecGate)
    """The verdict on the spec for the attempt to launch (tenancy/spec_check.py)."""
    voted: bool = False
    """Whether the job's node-lost incidents were recorded in the operator's NodeVotes."""
    awaited: str | None = None
    """The predecessor's object the job waits to see gone (logged once)."""
    effective: tuple[tuple[int | None, int], EffectivePolicy] | None = None
    """The job's effective policy, by the spec generation and the policy catalog's revision
    it was computed from."""


@dataclass(frozen=True)
class JobKey:
    namespace: str
    name: str


def _with_vanished(
    facts: list[PodFacts], memory: JobMemory, status: StableTrainingJobStatus
) -> list[PodFacts]:
    """A pod of the current attempt seen before and gone now (force-deleted, lost node)
    counts as a failed worker, even though the index no longer holds it."""
    present = {p.name for p in facts}
    for pod in facts:
        memory.seen[pod.name] = pod.attempt
    if status.phase not in SCRAPED_PHASES:
        return facts
    vanished = [
        PodFacts(
            name=name,
            attempt=attempt,
            rank=int(name.rsplit("-", 1)[1]),
            state=PodState.GONE,
            node=None,
            ip=None,
            deleting=True,
            reason="Vanished",
        )
        for name, attempt in memory.seen.items()
        if attempt == status.attempt and name not in present
    ]
    return facts + vanished


def _remember_nodes(memory: JobMemory, facts: Iterable[PodFacts], attempt: int) -> None:
    for pod in facts:
        if pod.attempt == attempt and pod.node:
            memory.nodes[pod.rank] = pod.node


async def _scrape(
    key: JobKey,
    facts: list[PodFacts],
    status: StableTrainingJobStatus,
    memory: JobMemory,
    *,
    scraper: Scraper | None,
    pacer: ScrapePacer | None,
    final: bool = False,
) -> tuple[ScrapeResult, ...]:
    """This tick's scrapes, at most one round per interval; `final` ignores the interval."""
    if not _scraped(status):
        if pacer is not None:
            pacer.forget((key.namespace, key.name))
        return ()
    interval = _round_interval(memory, pacer)
    if not final and time.monotonic() - memory.last_scrape < interval:
        return ()
    memory.last_scrape = time.monotonic()
    keep_alive = interval < KEEPALIVE_SECONDS
    targets = [
        ScrapeTarget(
            p.name,
            pods.agent_url(p.ip, p.agent_port),
            p.attempt,
            memory.status_credential,
            keep_alive=keep_alive,
        )
        for p in facts
        if p.attempt == status.attempt and p.state is PodState.RUNNING and p.ip
    ]
    if scraper is None:
        results = await scrape_all(targets, SCRAPE_TIMEOUT_SECONDS)
    else:
        results = await scraper.scrape_all(targets, SCRAPE_TIMEOUT_SECONDS)
    metrics.SCRAPES.inc(len(results))
    for result in results:
        if result.error is not None:
            metrics.SCRAPE_ERRORS.labels(result.error.value).inc()
        if result.supervisor is not None:
            memory.supervisors[result.pod] = result.supervisor
    failing = any(p.attempt == status.attempt and p.state is PodState.FAILED for p in facts)
    memory.close_eye = (
        status.phase is Phase.CONFIRMING
        or failing
        or any(r.status is None or r.status.firing for r in results)
    )
    if pacer is not None:
        pacer.enrol((key.namespace, key.name), len(targets))
    return tuple(results)


def _scraped(status: StableTrainingJobStatus) -> bool:
    if status.phase is Phase.STOPPING:
        return status.plan is not None and status.plan.in_place
    return status.phase in SCRAPED_PHASES


def _report_due(
    facts: Iterable[PodFacts], status: StableTrainingJobStatus, memory: JobMemory
) -> bool:
    """A round is due now, whatever the interval: a supervised pod of the attempt turned not
    ready (its attempt ended on its own) and no report says so yet, or the pods are being
    stopped in place (each tick reads whether they stopped)."""
    if status.phase is Phase.STOPPING:
        return _scraped(status)
    return any(
        p.supervised
        and p.attempt == status.attempt
        and p.ready is False
        and not attempt_ended(memory.supervisors.get(p.name), p.attempt)
        for p in facts
    )


def _round_interval(memory: JobMemory, pacer: ScrapePacer | None) -> float:
    """Seconds from the job's last round to its next, at the pacer's rate of now."""
    if pacer is None:
        return FAST_INTERVAL_SECONDS
    return pacer.interval(close_eye=memory.close_eye)


async def _settled(
    first: tuple[ScrapeResult, ...],
    scrape: Callable[[], Awaitable[tuple[ScrapeResult, ...]]],
) -> tuple[ScrapeResult, ...]:
    """`first` (this tick's round, or one of `scrape` when there was none), then rounds of
    `scrape` while a pod answers with a copy in flight, at most SETTLE_SECONDS; each pod's
    newest answer (an agent that ended after it answered is not forgotten)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    newest: dict[str, ScrapeResult] = {}
    results = first or await scrape()
    while True:
        for result in results:
            if result.status is not None or result.pod not in newest:
                newest[result.pod] = result
        busy = any(r.status is not None and copies_in_flight(r.status) for r in results)
        if not busy or time.monotonic() + SETTLE_PAUSE_SECONDS >= deadline:
            return tuple(newest.values())
        await asyncio.sleep(SETTLE_PAUSE_SECONDS)
        results = await scrape()


def _progress(
    memory: JobMemory, facts: list[PodFacts], scrapes: tuple[ScrapeResult, ...], attempt: int
) -> tuple[RankProgress, ...]:
    """Each running pod's newest heartbeat, marked silent when its agent did not answer
    this scrape; empty between scrapes (nothing new to judge)."""
    if not scrapes:
        return ()
    now = datetime.now(UTC)
    by_pod = {p.name: p for p in facts}
    for result in scrapes:
        pod = by_pod.get(result.pod)
        agent = result.status
        key = (result.pod, attempt)
        if agent is not None and agent.heartbeat is not None and agent.attempt == attempt:
            node = pod.node if pod is not None else agent.node
            memory.beats[key] = RankProgress(
                result.pod, node, agent.heartbeat, agent.updated_at, now
            )
        elif key in memory.beats:
            memory.beats[key] = dataclasses.replace(memory.beats[key], silent=True)
    running = {
        (p.name, attempt) for p in facts if p.attempt == attempt and p.state is PodState.RUNNING
    }
    memory.beats = {key: beat for key, beat in memory.beats.items() if key in running}
    return tuple(memory.beats.values())


def _stops_now(status: StableTrainingJobStatus, transition: Transition) -> bool:
    """This tick decided an action that stops the pods (they are still there)."""
    return (
        status.phase in SCRAPED_PHASES
        and transition.status.phase is Phase.STOPPING
        and transition.status.plan is not None
    )


def _known_skip_ranges(
    status: StableTrainingJobStatus, memory: JobMemory
) -> tuple[SkipRange, ...] | None:
    """The whole skip list when no read is needed: inline in status, or spilled to a
    ConfigMap only this operator writes and already read (None: read it)."""
    name = status.skip_ranges_config_map
    if name is None:
        return status.active_skip_ranges
    if memory.skip_ranges is not None and memory.skip_ranges[0] == name:
        return memory.skip_ranges[1]
    return None


def _read_skip_ranges(
    kube: Kube, job: pods.JobRef, status: StableTrainingJobStatus, memory: JobMemory
) -> tuple[SkipRange, ...]:
    """The spilled skip list from its ConfigMap, remembered until this operator rewrites it."""
    name = status.skip_ranges_config_map
    if name is None:
        return status.active_skip_ranges
    data = kube.config_map_data(job.namespace, name, job.uid) or {}
    raw = data.get(pods.SKIP_RANGES_KEY)
    if raw is None:
        _log.error("job %s: skip-range ConfigMap %s is missing or not the job's; using the "
                   "inline ranges", job.name, name)  # fmt: skip
        return status.active_skip_ranges
    ranges = tuple(SkipRange.model_validate(item) for item in json.loads(raw))
    memory.skip_ranges = (name, ranges)
    return ranges


def _attempt_directives(
    kube: Kube, job: pods.JobRef, memory: JobMemory, attempt: int
) -> Directives | None:
    """The attempt's initial directives from their ConfigMap, remembered in memory (the tick
    looks there first, so each attempt's are read once)."""
    name = naming.directives_config_map(job.name, attempt)
    data = kube.config_map_data(job.namespace, name, job.uid)
    if not data or DIRECTIVES_FILE_KEY not in data:
        return None
    try:
        directives = parse_directives(data[DIRECTIVES_FILE_KEY])
    except ContractError as error:
        _log.error("job %s: directives of attempt %d unreadable: %s", job.name, attempt, error)
        return None
    _remember_directives(memory, attempt, directives)
    return directives


def _remember_directives(memory: JobMemory, attempt: int, directives: Directives) -> None:
    """Keeps `attempt`'s directives and those of the attempt before it (a launch stores the
    next attempt's while the status still names the current one). Older attempts' are never
    asked for again; kept, a job through hundreds of recoveries held every one."""
    memory.directives[attempt] = directives
    for old in [a for a in memory.directives if a < attempt - 1]:
        del memory.directives[old]


def ensure_base(kube: Kube, job: pods.JobRef, memory: JobMemory, network: NetworkSettings) -> None:
    """The token Secret (with the checkpoint key: 256 random bits like the token), the
    headless Service and the job's NetworkPolicy: once per job and operator start (the tick
    calls it until memory.base_ready), kept for every attempt; the policy is brought in line
    with the operator's settings. A Secret that exists keeps its values: a job's key never
    changes. NotOwnedError when another owner holds one of the names."""
    kube.create(pods.build_token_secret(job, new_token(), checkpoint_key=new_token()))
    kube.create(pods.build_service(job))
    if network.enabled:
        kube.create_or_update(build_network_policy(job, pods.agent_port(), network), "spec")
    data = kube.secret_data(job.namespace, naming.token_secret(job.name), job.uid) or {}
    memory.token = data.get(TOKEN_SECRET_KEY)
    memory.status_credential = status_credential(memory.token) if memory.token else ""
    memory.signed_checkpoints = CHECKPOINT_KEY_SECRET_KEY in data
    memory.base_ready = True


def _avoid_required(kube: Kube, spec: StableTrainingJobSpec, plan: Launch) -> bool:
    """Required anti-affinity only while the other Ready, schedulable nodes can hold every
    pod; otherwise (or without permission to list nodes) it is only preferred."""
    if not plan.avoid_nodes or not plan.avoid_required:
        return False
    ready = kube.schedulable_nodes()
    if ready is None:
        return False
    others = [n for n in ready if n not in plan.avoid_nodes]
    return len(others) >= spec.workers.nodes


def launch(kube: Kube, job: pods.JobRef, spec: StableTrainingJobSpec, plan: Launch) -> None:
    """Directives first (the pods mount them), then the attempt's pods: those kept from the
    stopped attempt relabelled with the new one (the tick sends their start orders next),
    a new pod for every other rank."""
    if plan.spill_skip_ranges is not None:
        spill = pods.build_skip_ranges_config_map(job, plan.spill_skip_ranges)
        kube.create_or_update(spill, "data")
    kube.create(pods.build_directives_config_map(job, plan.directives))
    attempt = plan.directives.attempt
    kept = dict(plan.in_place)
    label = {naming.ATTEMPT_LABEL: str(attempt)}
    each(lambda name: kube.label_pod(job.namespace, name, label), list(kept.values()))
    required = _avoid_required(kube, spec, plan)
    if plan.avoid_nodes:
        _log.info("job %s: attempt %d avoids suspect node(s) %s (%s)", job.name,
                  attempt, ", ".join(plan.avoid_nodes),
                  "required" if required else "preferred")  # fmt: skip
    attempt_pods = [
        pods.build_pod(
            spec,
            job,
            attempt,
            rank,
            plan.preferred_nodes[rank] if rank < len(plan.preferred_nodes) else None,
            avoid_nodes=plan.avoid_nodes,
            avoid_required=required,
            master_pod=kept.get(0),
            placement=plan.placement,
        )
        for rank in range(spec.workers.nodes)
        if rank not in kept
    ]
    each(kube.create, attempt_pods)


def master_pod(facts: Iterable[PodFacts], attempt: int) -> str | None:
    """The pod that runs node rank 0 of `attempt` (None: none exists yet)."""
    return next((p.name for p in facts if p.attempt == attempt and p.rank == 0), None)


async def _order(
    scraper: Scraper | None,
    memory: JobMemory,
    facts: Iterable[PodFacts],
    orders: Mapping[str, Order],
) -> None:
    """Send each pod its order; the answers' reports are kept like scraped ones."""
    if not orders or not memory.token:
        return
    by_name = {p.name: p for p in facts}
    targets = [
        (name, pods.agent_url(by_name[name].ip or "", by_name[name].agent_port), order)
        for name, order in orders.items()
        if name in by_name and by_name[name].ip
    ]
    session = None if scraper is None else scraper.session
    reports = await send_orders(session, targets, memory.token, PUT_TIMEOUT_SECONDS)
    memory.supervisors.update(reports)


def _start_orders(
    spec: StableTrainingJobSpec,
    job: pods.JobRef,
    directives: Directives | None,
    names: Iterable[str],
    master: str | None,
) -> dict[str, Order]:
    """Start orders of `directives` for the kept pods `names`. Directives read back from the
    attempt's ConfigMap (after an operator restart) lack the checkpoint settings a new pod's
    environment holds: a kept pod gets `spec`'s (the spec in force)."""
    if directives is None or master is None:
        return {}
    if directives.checkpoints is None:
        directives = directives.model_copy(update={"checkpoints": checkpoint_settings(spec)})
    order: Order = pods.start_order(spec, job, directives, master)
    return dict.fromkeys(names, order)


async def _put_live(
    scraper: Scraper | None, token: str | None, transition: Transition, facts: list[PodFacts]
) -> None:
    if transition.live is None or not token:
        return
    session = None if scraper is None else scraper.session
    by_name = {p.name: p for p in facts}
    for name in transition.live_pods:
        pod = by_name.get(name)
        if pod is None or not pod.ip:
            continue
        try:
            url = pods.agent_url(pod.ip, pod.agent_port)
            result = await put_directives(session, url, transition.live, token, PUT_TIMEOUT_SECONDS)
        except (AgentUnreachableError, ContractError) as error:
            _log.warning(
                "live directives to %s not delivered (retried next scrape): %s", name, error
            )
            continue
        if result.status != HTTPStatus.OK:
            _log.warning("live directives to %s refused (HTTP %d): %s", name, result.status,
                         result.ack.message)  # fmt: skip


def status_json(status: StableTrainingJobStatus) -> dict[str, Any]:
    """The status as the API server accepts it: camelCase, JSON types, no NaN (null instead:
    the schema's numbers are nullable, and a trip's evidence text still says what was seen)."""
    data: dict[str, Any] = non_finite_replaced(
        status.model_dump(mode="json", by_alias=True), lambda _: None
    )
    return data


_COUNTED_BY_SIGNAL = {
    StatusCounter.ROLLBACKS: metrics.ROLLBACKS,
    StatusCounter.ALERTS: metrics.ALERTS,
}
"""Decisions that also count in a metric labelled by the signal that caused them."""


def _record_metrics(key: JobKey, recovery: RecoverySpec, transition: Transition) -> None:
    budgets = recovery.budgets
    metrics.set_budget_remaining(
        key.namespace,
        key.name,
        rollbacks=budgets.max_rollbacks - transition.ledger.rollbacks_used,
        restarts=budgets.max_restarts - transition.ledger.restarts_used,
    )
    decision = transition.decision
    if decision is not None:
        metrics.DECISIONS.labels(decision.action.value).inc()
        counter = kind_of(decision.action).counter
        if counter in _COUNTED_BY_SIGNAL:
            _COUNTED_BY_SIGNAL[counter].labels(decision.signal).inc()
    if transition.recovered_after is not None:
        metrics.RECOVERY_SECONDS.observe(transition.recovered_after.total_seconds())


def _count_failed(was: Phase, written: StableTrainingJobStatus) -> None:
    """Count the job in jobs_failed_total when the status just written moved it into Failed
    from `was`. Counted right after the write: the tick's later work (pod deletions, Events,
    the Kueue patch) may fail, and the tick that retries it starts from Failed already."""
    if written.phase is Phase.FAILED and was is not Phase.FAILED:
        failed = condition(written.conditions, ConditionType.FAILED)
        metrics.JOBS_FAILED.labels(failed.reason if failed is not None else "Unknown").inc()


def remediate(
    kube: Kube,
    remediation: NodeRemediation,
    votes: NodeVotes,
    nodes: set[str],
    now: datetime,
) -> None:
    """Taint or cordon those of `nodes` (their node-lost count just grew) that are now due
    (remediation.py; off by default)."""
    for verdict in votes.due(remediation, nodes, now):
        try:
            if not _patch_node(kube, verdict, remediation.action):
                continue
        except ApiError as error:
            _log.warning("node %s not remediated (%s): %s", verdict.node, remediation.action,
                         error.reason)  # fmt: skip
            continue
        _log.warning("node %s %s: it lost the pods of %s %d time(s): %s", verdict.node,
                     "tainted" if remediation.action == "Taint" else "cordoned",
                     ", ".join(verdict.jobs), verdict.incidents, verdict.last_reason)  # fmt: skip


NODE_PATCH_ATTEMPTS = 5
"""Reads and patches of one node while others write it: the fence is the node's whole
resourceVersion, which its kubelet's status and the node lifecycle's taints also move."""

NODE_PATCH_PAUSE_SECONDS = 0.1
"""The pause after the first 409, doubled after each one (0.1 + 0.2 + 0.4 + 0.8 s in all):
a node that just registered or turned Ready takes several writes in a burst."""


def _patch_node(kube: Kube, verdict: NodeVerdict, action: NodeAction) -> bool:
    """Read the node's taints and patch it at that version; a 409 (the node changed in
    between) means pause and read again. False when the node is gone or already tainted."""
    for attempt in range(1, NODE_PATCH_ATTEMPTS + 1):
        read = kube.node_taints(verdict.node)
        if read is None:
            return False
        taints, version = read
        if action is NodeAction.TAINT and tainted(taints):
            return False
        try:
            kube.patch_node(verdict.node, node_patch(verdict, taints, action, version))
            return True
        except ApiError as error:
            if error.status != HTTPStatus.CONFLICT or attempt == NODE_PATCH_ATTEMPTS:
                raise
        time.sleep(NODE_PATCH_PAUSE_SECONDS * 2 ** (attempt - 1))
    raise AssertionError("unreachable: the last attempt returns or raises")


def _vote(
    memory: JobMemory,
    votes: NodeVotes,
    key: JobKey,
    before: StableTrainingJobStatus,
    after: StableTrainingJobStatus,
) -> set[str]:
    """Record the job's node-lost incidents; the nodes whose count grew in this tick (the
    first tick since the daemon started records the persisted count as it stands)."""
    job = f"{key.namespace}/{key.name}"
    if not memory.voted:
        votes.record(job, before.suspect_nodes)
        memory.voted = True
    return votes.record(job, after.suspect_nodes)


async def _effective(
    key: JobKey, view: JobView, memory: JobMemory, catalog: PolicyCatalog | None
) -> EffectivePolicy:
    """The job's spec under the policies selecting its namespace, computed again only when
    the spec, the policies or the namespace's labels changed."""
    if catalog is not None and catalog.labels_due(key.namespace):
        await asyncio.to_thread(catalog.read_labels, key.namespace)
    generation = view.job["metadata"].get("generation")
    stamp = (generation, catalog.revision if catalog is not None else 0)
    if memory.effective is not None and memory.effective[0] == stamp:
        return memory.effective[1]
    policies = catalog.applying_to(key.namespace) if catalog is not None else ()
    effective = effective_policy(view.spec, policies)
    memory.effective = (stamp, effective)
    return effective


async def _view(
    kube: Kube, key: JobKey, live: Mapping[str, Any], memory: JobMemory
) -> JobView | bool:
    """The version of the job this tick acts on (jobview.py); False once the job is gone or
    being deleted, True while its newest version does not validate (nothing to act on)."""
    metadata = live.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return False
    version = metadata.get("resourceVersion")
    if version is not None and version == memory.rejected_version:
        return True
    if source(memory.view, version, time.monotonic()) is Source.HELD and memory.view is not None:
        return memory.view
    job = await asyncio.to_thread(kube.get_job, key.namespace, key.name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return False
    parsed = parse(job)
    if parsed is None:
        memory.view, memory.rejected_version = None, job["metadata"]["resourceVersion"]
        return True
    spec, status = parsed
    version = job["metadata"]["resourceVersion"]
    memory.view = JobView(version, identity(job), _held_spec(memory, spec), status,
                          time.monotonic())  # fmt: skip
    return memory.view


def _held_spec(memory: JobMemory, spec: StableTrainingJobSpec) -> StableTrainingJobSpec:
    """The spec object the daemon already holds when `spec` equals it: a read of an unchanged
    spec (after a conflict, or a change to the status alone) would otherwise leave the job
    holding two copies, the new one in the view and the old one in its effective policy."""
    held = [memory.view.spec] if memory.view is not None else []
    if memory.effective is not None and memory.effective[1].spec is not None:
        held.append(memory.effective[1].spec)
    return next((h for h in held if h == spec), spec)


async def _record(
    kube: Kube,
    key: JobKey,
    view: JobView,
    status: StableTrainingJobStatus,
    memory: JobMemory,
    *,
    progress_seconds: float,
    clock: StageClock | None = None,
    progress_writes: asyncio.Semaphore | None = None,
) -> bool:
    """Write `status` if it holds a decision or progress is due; either way it becomes the
    held status. True when it was written. The `clock` notes when a thread of the API pool
    took the write (the wait behind other blocking calls, apart from the request's own).
    A progress-only write waits for one of `progress_writes` first, so that decisions
    always find a thread."""
    now = time.monotonic()
    due = write_needed(
        view.status,
        status,
        progress_written_at=memory.progress_written_at,
        now=now,
        progress_seconds=progress_seconds,
    )
    if not due:
        memory.view = dataclasses.replace(view, status=status)
        return False
    body = status_json(status)

    def write() -> dict[str, Any]:
        if clock is not None:
            clock.mark("queued for a thread")
        return kube.write_status(key.namespace, key.name, view.resource_version, body)

    try:
        cap = progress_writes if due is StatusWrite.PROGRESS else None
        async with cap or contextlib.nullcontext():
            written = await asyncio.to_thread(write)
    except StaleStatusError:
        memory.view = None
        raise
    version = written["metadata"]["resourceVersion"]
    memory.view = JobView(version, identity(written), view.spec, status, now)
    memory.progress_written_at = now
    return True


async def tick(
    kube: Kube,
    key: JobKey,
    live: Mapping[str, Any],
    indexed: Iterable[PodFacts],
    memory: JobMemory,
    *,
    remediation: NodeRemediation | None = None,
    votes: NodeVotes | None = None,
    progress_seconds: float = 0.0,
    scraper: Scraper | None = None,
    pacer: ScrapePacer | None = None,
    kueue: KueueApi | None = None,
    workloads: Iterable[WorkloadFacts] = (),
    tenancy: TenancySettings | None = None,
    catalog: PolicyCatalog | None = None,
    progress_writes: asyncio.Semaphore | None = None,
) -> bool:
    """One reconcile; False once the job is gone (the daemon may end). `live` is kopf's live
    body of the job, its metadata only (handlers/live_body.py); progress numbers are written
    at most every `progress_seconds`; the agents are scraped, and sent live directives,
    through the operator's shared `scraper` (a session per round without one) as often as
    its `pacer` allows (every second without one). Nothing is created for a spec that
    breaks the cluster's `tenancy` settings (their defaults without it): the job is held
    with InvalidSpec. With `kueue` (the operator's --kueue), a job with the queue-name label
    runs only while its Workload (among `workloads`, the job's in the operator's index) is
    admitted. The job's platform policies come from `catalog` (none without one). A
    progress-only status write waits for one of `progress_writes` (unbounded without)."""
    tenancy = tenancy or TenancySettings()
    clock = StageClock(memory.woken_at)
    view = await _view(kube, key, live, memory)
    if isinstance(view, bool):
        if not view:
            metrics.forget_job(key.namespace, key.name)
            if pacer is not None:
                pacer.forget((key.namespace, key.name))
            if votes is not None:
                votes.forget(f"{key.namespace}/{key.name}")
        return view
    job, spec, status = view.job, view.spec, view.status
    ref = pods.JobRef(key.name, key.namespace, job["metadata"]["uid"])
    generation = job["metadata"].get("generation")
    if not memory.base_ready:
        if await _base_or_hold(kube, key, view, memory, ref=ref, tenancy=tenancy):
            return True
        if not memory.signed_checkpoints:
            await asyncio.to_thread(kube.event, job, "Warning", Reason.CHECKPOINTS_UNSIGNED,
                                    UNSIGNED_MESSAGE)  # fmt: skip
    facts = _with_vanished(list(indexed), memory, status)
    _remember_nodes(memory, facts, status.attempt)
    present = {p.name for p in facts}
    memory.supervisors = {n: r for n, r in memory.supervisors.items() if n in present}
    due_now = _report_due(facts, status, memory)
    scrapes = await _scrape(key, facts, status, memory, scraper=scraper, pacer=pacer, final=due_now)
    clock.mark("look and scrape")
    progress = _progress(memory, facts, scrapes, status.attempt)
    skip = _known_skip_ranges(status, memory)
    if skip is None:
        skip = await asyncio.to_thread(_read_skip_ranges, kube, ref, status, memory)
    directives = memory.directives.get(status.attempt)
    if directives is None:
        directives = await asyncio.to_thread(_attempt_directives, kube, ref, memory, status.attempt)
    ledger = PolicyLedger.from_job_status(status)
    target = await _effective(key, view, memory, catalog)
    preflight_pod = None
    if needs_preflight_pod(spec, status):
        problems = await asyncio.to_thread(
            memory.spec_gate.check, kube, spec, ref, tenancy,
            generation=generation, attempt=status.attempt, preflight_generation=generation,
        )  # fmt: skip
        if problems:
            return await _hold(kube, key, view, memory, problems)
        try:
            preflight_pod = await asyncio.to_thread(
                ensure_preflight_pod, kube, ref, spec, generation
            )
        except NotOwnedError as error:
            return await _not_owned(kube, key, view, memory, error)
    queued = _queued(job, live, kueue)
    workload = own_workload(queued, workloads) if queued is not None else None
    admission = None
    if queued is not None and kueue is not None:
        admission = await asyncio.to_thread(read_admission, kueue, queued, workload, memory.queue)
    world = World(
        now=datetime.now(UTC),
        job=key.name,
        spec=target.spec or spec,
        generation=generation,
        pods=tuple(with_reports(facts, memory.supervisors)),
        supervisors=dict(memory.supervisors),
        handed_over=tuple(
            r.own for r in scrapes if r.own is not None and r.own.attempt == status.attempt
        ),
        scrapes=scrapes,
        skip_ranges=skip,
        ledger=ledger,
        previous_nodes=tuple(memory.nodes.get(r) for r in range(spec.workers.nodes)),
        attempt_directives=directives,
        preflight_pod=preflight_pod,
        progress=progress,
        admission=admission,
        target=target,
    )
    transition = advance(status, world)
    clock.mark("decide")
    if _stops_now(status, transition):
        # Before the pods go, those still running are scraped until no copy they list is on
        # its way to the PFS (at least once when the pod watch decided), so the plan sees a
        # save that committed or landed after the previous scrape; a finding the later
        # rounds no longer show does not undo the stop.
        final = await _settled(
            scrapes,
            lambda: _scrape(key, facts, status, memory, scraper=scraper, pacer=pacer, final=True),
        )
        if final != scrapes:
            settled = advance(status, dataclasses.replace(world, scrapes=final))
            transition = settled if _stops_now(status, settled) else transition
        clock.mark("settle")
    for note in transition.deferred:
        _log.debug("job %s: %s", key.name, note.message)
    plan = transition.launch
    if plan is not None:
        launched = await _launch_or_hold(
            kube, key, view, memory, ref=ref, spec=world.spec, plan=plan, tenancy=tenancy
        )
        if launched:
            return True
        if plan.spill_skip_ranges is not None:
            memory.skip_ranges = None
        started = plan.directives
        _remember_directives(memory, started.attempt, started)
        kept = dict(plan.in_place)
        master = kept.get(0) or naming.pod_name(key.name, started.attempt, 0)
        await _order(
            scraper, memory, facts, _start_orders(world.spec, ref, started, kept.values(), master)
        )
    if memory.spec_gate.passed(generation):
        transition = dataclasses.replace(
            transition, status=invalid_spec.accepted(transition.status, world)
        )
    if plan is not None:
        clock.mark("launch")
    written = await _record(
        kube, key, view, transition.status, memory, progress_seconds=progress_seconds,
        clock=clock, progress_writes=progress_writes,
    )  # fmt: skip
    clock.mark("write")
    if written:
        _count_failed(status.phase, transition.status)
    if written and transition.status.phase is not status.phase:
        _log.info("job %s: %s -> %s (%s)", key.name, status.phase, transition.status.phase,
                  clock.summary())  # fmt: skip
    if transition.status.attempt != status.attempt:
        memory.seen = {n: a for n, a in memory.seen.items() if a >= transition.status.attempt}
    if transition.delete_pods:
        await asyncio.to_thread(
            each,
            lambda name: kube.delete_pod(key.namespace, name, force=transition.force_delete),
            transition.delete_pods,
        )
    if transition.live is not None:
        await _put_live(scraper, memory.token, transition, facts)
    if transition.stop_pods:
        stop: Order = StopOrder(
            attempt=transition.stop_attempt, grace_seconds=pods.grace_seconds(world.spec)
        )
        await _order(scraper, memory, facts, dict.fromkeys(transition.stop_pods, stop))
    if transition.start_pods:
        current = transition.status.attempt
        await _order(
            scraper,
            memory,
            facts,
            _start_orders(
                world.spec,
                ref,
                memory.directives.get(current) or directives,
                transition.start_pods,
                master_pod(facts, current),
            ),
        )
    for event in transition.events:
        await asyncio.to_thread(kube.event, job, event.type, event.reason, event.message)
    for message in rejected_copies.announce(memory.announced_rejections, scrapes):
        await asyncio.to_thread(kube.event, job, "Warning", Reason.CHECKPOINT_REJECTED, message)
    if remediation is not None and votes is not None:
        grew = _vote(memory, votes, key, status, transition.status)
        if grew:
            await asyncio.to_thread(remediate, kube, remediation, votes, grew, world.now)
    if queued is not None and kueue is not None:
        await _sync_workload(
            kube, kueue, job, spec, transition, queued=queued, pods_seen=facts,
            workload=workload, now=world.now,
        )  # fmt: skip
    policy = transition.status.policy
    _record_metrics(key, policy.recovery if policy is not None else spec.recovery, transition)
    memory.next_tick_at = look_again_by(
        view,
        (live.get("metadata") or {}).get("resourceVersion"),
        _next_tick_at(transition.status.phase, spec, memory, pacer),
    )
    if admission is not None and not admission.may_run and not facts:
        memory.next_tick_at = time.monotonic() + QUEUED_TICK_SECONDS
    return True


IDLE_RECHECK_SECONDS = 60.0
"""How often a finished job, or one suspended by its spec, ticks on its own. Nothing of
theirs is due at a time: a change of the job or its pods wakes the daemon at once. On the
daemon's 0.5 s clock, a thousand finished jobs cost the operator two thousand ticks a
second doing nothing."""
QUEUED_TICK_SECONDS = 60.0
"""A job waiting for Kueue without pods ticks when its Workload (or it) changes, and at
least this often: not on the 0.5 s clock of the phases that wait on time."""


@dataclass
class StageClock:
    """Where one tick's time went, for the log line of a phase change: a decision's delay is
    the wake's wait for the loop plus these stages (bench/operator_scale.py reads them)."""

    woken_at: float | None
    marks: list[tuple[str, float]] = field(default_factory=lambda: [("", time.monotonic())])

    def mark(self, stage: str) -> None:
        self.marks.append((stage, time.monotonic()))

    def summary(self) -> str:
        start = self.marks[0][1]
        waited = f"woken {start - self.woken_at:.2f} s before; " if self.woken_at else ""
        stages = ", ".join(
            f"{stage} {at - before:.2f} s"
            for (_, before), (stage, at) in zip(self.marks, self.marks[1:], strict=False)
        )
        return waited + stages


def _queued(
    job: Mapping[str, Any], live: Mapping[str, Any], kueue: KueueApi | None
) -> QueuedJob | None:
    """The job as Kueue sees it, when the operator runs with --kueue and the job carries the
    queue-name label (read from kopf's live body: the held identity keeps no labels)."""
    metadata = job["metadata"]
    labels = dict((live.get("metadata") or {}).get("labels") or {})
    queue = queue_name(labels)
    if kueue is None or queue is None:
        return None
    return QueuedJob(metadata["name"], metadata["namespace"], metadata["uid"], labels, queue)


async def _sync_workload(
    kube: Kube,
    kueue: KueueApi,
    job: Mapping[str, Any],
    spec: StableTrainingJobSpec,
    transition: Transition,
    *,
    queued: QueuedJob,
    pods_seen: list[PodFacts],
    workload: WorkloadFacts | None,
    now: datetime,
) -> None:
    """After the status write: the Workload writes the job's new state calls for (create,
    PodsReady, giving the quota back after an eviction, Finished, the finalizer)."""
    status = transition.status
    current = [p for p in pods_seen if p.attempt == status.attempt]
    done = sum(p.state in (PodState.RUNNING, PodState.SUCCEEDED) for p in current)
    ended = [c.message for c in status.conditions if c.type in ("Complete", "Failed")]
    writes = workload_writes(
        status.phase,
        workload,
        pods_left=bool(pods_seen) or transition.launch is not None,
        pods_ready=done >= spec.workers.nodes,
        end_message=ended[-1] if ended else status.phase.value,
        now=now,
    )
    events = await asyncio.to_thread(carry_out, kueue, queued, spec, writes, workload)
    for kind, reason, message in events:
        await asyncio.to_thread(kube.event, dict(job), kind, reason, message)


@dataclass(frozen=True)
class _Stamp:
    now: datetime
    generation: int | None


async def _hold(
    kube: Kube,
    key: JobKey,
    view: JobView,
    memory: JobMemory,
    problems: Sequence[SpecProblem],
    *,
    recheck_seconds: float = HELD_RECHECK_SECONDS,
) -> bool:
    """Nothing is created: the status the tick began with, plus InvalidSpec naming each
    problem, written only when that changes it, with an Event when it is news."""
    stamp = _Stamp(datetime.now(UTC), view.job["metadata"].get("generation"))
    status, news = invalid_spec.held(view.status, problems, stamp)
    await _record(kube, key, view, status, memory, progress_seconds=0.0)
    if news is not None:
        _log.warning("job %s: held, nothing is created: %s", key.name, news)
        await asyncio.to_thread(kube.event, view.job, "Warning", Reason.INVALID_SPEC, news)
    memory.next_tick_at = time.monotonic() + recheck_seconds
    return True


async def _base_or_hold(
    kube: Kube,
    key: JobKey,
    view: JobView,
    memory: JobMemory,
    *,
    ref: pods.JobRef,
    tenancy: TenancySettings,
) -> bool:
    """The job's base objects (ensure_base), unless its name cannot name them or another
    owner holds one: then the job is held (True)."""
    nodes, attempt = view.spec.workers.nodes, view.status.attempt
    problems = name_problems(key.name, nodes=nodes, attempt=attempt)
    if problems:
        return await _hold(kube, key, view, memory, problems)
    try:
        await asyncio.to_thread(ensure_base, kube, ref, memory, tenancy.network)
    except NotOwnedError as error:
        return await _not_owned(kube, key, view, memory, error)
    return False


async def _launch_or_hold(
    kube: Kube,
    key: JobKey,
    view: JobView,
    memory: JobMemory,
    *,
    ref: pods.JobRef,
    spec: StableTrainingJobSpec,
    plan: Launch,
    tenancy: TenancySettings,
) -> bool:
    """The launch of `spec` (the job's, under its platform policies), once it passed every
    check for this attempt (tenancy/spec_check.py); held instead (True) when it did not,
    when another owner holds one of the names, or when the API server refuses the pods
    themselves."""
    generation = view.job["metadata"].get("generation")
    attempt = plan.directives.attempt
    problems = await asyncio.to_thread(
        memory.spec_gate.check, kube, spec, ref, tenancy, generation=generation,
        attempt=attempt,
    )  # fmt: skip
    if problems:
        return await _hold(kube, key, view, memory, problems)
    try:
        await asyncio.to_thread(launch, kube, ref, spec, plan)
    except NotOwnedError as error:
        return await _not_owned(kube, key, view, memory, error)
    except ApiError as error:
        if not refuses_spec(error):
            raise
        memory.spec_gate.refused(generation, attempt, api_refusal(error))
        return await _hold(kube, key, view, memory, memory.spec_gate.problems)
    return False


async def _not_owned(
    kube: Kube, key: JobKey, view: JobView, memory: JobMemory, error: NotOwnedError
) -> bool:
    """An object the job needs is another owner's: never used. A predecessor's (a job of
    the same name deleted a moment ago) is waited for quietly, garbage collection removes
    it; any other holds the job with InvalidSpec (NameTaken) and is looked at again."""
    if not error.predecessor:
        problems = [error.problem()]
        return await _hold(
            kube, key, view, memory, problems, recheck_seconds=NAME_TAKEN_RETRY_SECONDS
        )
    if memory.awaited != str(error):
        _log.info("job %s: waiting for garbage collection: %s", key.name, error)
        memory.awaited = str(error)
    memory.next_tick_at = time.monotonic() + PREDECESSOR_RETRY_SECONDS
    return True


def _next_tick_at(
    phase: Phase, spec: StableTrainingJobSpec, memory: JobMemory, pacer: ScrapePacer | None
) -> float:
    """A running job has nothing to do until its next round unless its world changes (the
    daemon ticks at once when its pods or its object change). A finished job, and one
    suspended by its spec, wait for such a change (IDLE_RECHECK_SECONDS); the other phases,
    and a suspend waiting for its save, wait on time (backoff, grace periods, bounds) and
    tick on the daemon's clock."""
    if phase is Phase.RUNNING and not spec.suspend:
        return memory.last_scrape + _round_interval(memory, pacer)
    if phase in (Phase.SUCCEEDED, Phase.FAILED) or (phase is Phase.SUSPENDED and spec.suspend):
        return time.monotonic() + IDLE_RECHECK_SECONDS
    return 0.0
