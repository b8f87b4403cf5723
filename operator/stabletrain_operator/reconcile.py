"""One reconcile tick of one job: gather the world, advance the machine, carry out its
transition.

Order is what makes a crash harmless: the transition's `launch` (idempotent creates) before
the status write, the status written once, then deletes, live directives and Events after it.
Events therefore never announce something the status does not hold.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

from kubernetes.client.exceptions import ApiException

from stabletrain_agent.contract.base import ContractError
from stabletrain_agent.contract.channel import new_token
from stabletrain_agent.contract.directives import Directives, SkipRange, parse_directives
from stabletrain_agent.contract.env import DIRECTIVES_FILE_KEY, TOKEN_SECRET_KEY
from stabletrain_operator import metrics, naming, pods
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import RecoverySpec, StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus, SuspectNode
from stabletrain_operator.directive_put import AgentUnreachableError, put_directives
from stabletrain_operator.finite import non_finite_replaced
from stabletrain_operator.jobview import JobView, Source, identity, parse, source, write_needed
from stabletrain_operator.kube import Kube, StaleStatusError, each
from stabletrain_operator.machine import Launch, Transition, World, advance
from stabletrain_operator.observe.pacing import FAST_INTERVAL_SECONDS, ScrapePacer
from stabletrain_operator.observe.pods import PodFacts, PodState
from stabletrain_operator.observe.scrape import Scraper, ScrapeResult, ScrapeTarget, scrape_all
from stabletrain_operator.observe.stall import RankProgress
from stabletrain_operator.plan.merged_inventory import copies_in_flight
from stabletrain_operator.platform_policy.catalog import PolicyCatalog
from stabletrain_operator.platform_policy.effective import EffectivePolicy, effective_policy
from stabletrain_operator.policy import PolicyLedger
from stabletrain_operator.policy.action_kind import StatusCounter
from stabletrain_operator.policy.action_registry import kind_of
from stabletrain_operator.preflight.pod import ensure_preflight_pod, needs_preflight_pod
from stabletrain_operator.remediation import NodeAction, NodeRemediation, due, node_patch

_log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_SECONDS = 2.0
PUT_TIMEOUT_SECONDS = 2.0
SCRAPED_PHASES = frozenset({Phase.RUNNING, Phase.CONFIRMING})
SETTLE_SECONDS = 10.0
"""How long a stop keeps scraping the pods still running while one lists a copy on its way
to the PFS. A rank killed outright breaks the others' collective: under gloo they end at
once, their agents first finishing such copies and answering until a scrape read the result
(stabletrain_agent.guard.HAND_OVER_SECONDS); under NCCL they hang with their agents
answering. One scrape, at the decision, came before the copies landed: the restart passed
over the newest checkpoint, or found none verified on the PFS and failed the job."""
SETTLE_PAUSE_SECONDS = 0.5


@dataclass
class JobMemory:
    """What one job's daemon keeps between ticks; all of it can be rebuilt after a restart."""

    token: str | None = None
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
    beats: dict[str, RankProgress] = field(default_factory=dict)
    """Newest heartbeat of each pod of the current attempt, kept while its agent is silent."""
    view: JobView | None = None
    """The newest version of the job read or written (jobview.py)."""
    rejected_version: str | None = None
    """A version whose spec or status did not validate (logged once, not read again)."""
    progress_written_at: float = 0.0
    skip_ranges: tuple[str, tuple[SkipRange, ...]] | None = None
    """The spilled skip list as last read from (or written to) its ConfigMap."""
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
    if status.phase not in SCRAPED_PHASES:
        if pacer is not None:
            pacer.forget((key.namespace, key.name))
        return ()
    if not final and time.monotonic() - memory.last_scrape < _round_interval(memory, pacer):
        return ()
    memory.last_scrape = time.monotonic()
    targets = [
        ScrapeTarget(p.name, pods.agent_url(p.ip, p.agent_port), p.attempt)
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
    failing = any(p.attempt == status.attempt and p.state is PodState.FAILED for p in facts)
    memory.close_eye = (
        status.phase is Phase.CONFIRMING
        or failing
        or any(r.status is None or r.status.firing for r in results)
    )
    if pacer is not None:
        pacer.enrol((key.namespace, key.name), len(targets))
    return tuple(results)


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
        if agent is not None and agent.heartbeat is not None:
            node = pod.node if pod is not None else agent.node
            memory.beats[result.pod] = RankProgress(
                result.pod, node, agent.heartbeat, agent.updated_at, now
            )
        elif result.pod in memory.beats:
            memory.beats[result.pod] = dataclasses.replace(memory.beats[result.pod], silent=True)
    running = {p.name for p in facts if p.attempt == attempt and p.state is PodState.RUNNING}
    memory.beats = {name: beat for name, beat in memory.beats.items() if name in running}
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
    kube: Kube, key: JobKey, status: StableTrainingJobStatus, memory: JobMemory
) -> tuple[SkipRange, ...]:
    """The spilled skip list from its ConfigMap, remembered until this operator rewrites it."""
    name = status.skip_ranges_config_map
    if name is None:
        return status.active_skip_ranges
    data = kube.config_map_data(key.namespace, name) or {}
    raw = data.get(pods.SKIP_RANGES_KEY)
    if raw is None:
        _log.error("job %s: skip-range ConfigMap %s is missing; using the inline ranges",
                   key.name, name)  # fmt: skip
        return status.active_skip_ranges
    ranges = tuple(SkipRange.model_validate(item) for item in json.loads(raw))
    memory.skip_ranges = (name, ranges)
    return ranges


def _attempt_directives(
    kube: Kube, key: JobKey, memory: JobMemory, attempt: int
) -> Directives | None:
    """The attempt's initial directives from their ConfigMap, remembered in memory (the tick
    looks there first, so each attempt's are read once)."""
    data = kube.config_map_data(key.namespace, naming.directives_config_map(key.name, attempt))
    if not data or DIRECTIVES_FILE_KEY not in data:
        return None
    try:
        directives = parse_directives(data[DIRECTIVES_FILE_KEY])
    except ContractError as error:
        _log.error("job %s: directives of attempt %d unreadable: %s", key.name, attempt, error)
        return None
    memory.directives[attempt] = directives
    return directives


def ensure_base(kube: Kube, job: pods.JobRef, memory: JobMemory) -> None:
    """The token Secret and the headless Service: once per job (the tick calls it until
    memory.base_ready), kept for every attempt."""
    kube.create(pods.build_token_secret(job, new_token()))
    kube.create(pods.build_service(job))
    memory.token = kube.secret_value(job.namespace, naming.token_secret(job.name), TOKEN_SECRET_KEY)
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
    """Directives first (the pods mount them), then every pod of the attempt."""
    if plan.spill_skip_ranges is not None:
        kube.replace_config_map(pods.build_skip_ranges_config_map(job, plan.spill_skip_ranges))
    kube.create(pods.build_directives_config_map(job, plan.directives))
    required = _avoid_required(kube, spec, plan)
    if plan.avoid_nodes:
        _log.info("job %s: attempt %d avoids suspect node(s) %s (%s)", job.name,
                  plan.directives.attempt, ", ".join(plan.avoid_nodes),
                  "required" if required else "preferred")  # fmt: skip
    attempt_pods = [
        pods.build_pod(
            spec,
            job,
            plan.directives.attempt,
            rank,
            plan.preferred_nodes[rank] if rank < len(plan.preferred_nodes) else None,
            avoid_nodes=plan.avoid_nodes,
            avoid_required=required,
        )
        for rank in range(spec.workers.nodes)
    ]
    each(kube.create, attempt_pods)


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


def remediate(
    kube: Kube,
    remediation: NodeRemediation,
    key: JobKey,
    before: StableTrainingJobStatus,
    after: StableTrainingJobStatus,
) -> None:
    """Taint or cordon the suspect nodes that just reached the threshold (off by default)."""
    job = f"{key.namespace}/{key.name}"
    for node in due(before.suspect_nodes, after.suspect_nodes, remediation):
        try:
            if not _patch_node(kube, node, remediation.action, job):
                continue
        except ApiException as error:
            _log.warning("job %s: node %s not remediated (%s): %s", key.name, node.node,
                         remediation.action, error.reason)  # fmt: skip
            continue
        _log.warning("job %s: node %s %s after %d incident(s): %s", key.name, node.node,
                     "tainted" if remediation.action == "Taint" else "cordoned",
                     node.incidents, node.last_reason)  # fmt: skip


NODE_PATCH_ATTEMPTS = 3
"""Reads and patches of one node while other controllers keep changing its taints."""


def _patch_node(kube: Kube, node: SuspectNode, action: NodeAction, job: str) -> bool:
    """Read the node's taints and patch it at that version; a 409 (its taints changed in
    between) means read again. False when the node is gone."""
    for attempt in range(1, NODE_PATCH_ATTEMPTS + 1):
        read = kube.node_taints(node.node)
        if read is None:
            return False
        taints, version = read
        try:
            kube.patch_node(node.node, node_patch(node, taints, action, job, version))
            return True
        except ApiException as error:
            if error.status != HTTPStatus.CONFLICT or attempt == NODE_PATCH_ATTEMPTS:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


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
    memory.view = JobView(version, identity(job), spec, status, time.monotonic())
    return memory.view


async def _record(
    kube: Kube,
    key: JobKey,
    view: JobView,
    status: StableTrainingJobStatus,
    memory: JobMemory,
    *,
    progress_seconds: float,
) -> bool:
    """Write `status` if it holds a decision or progress is due; either way it becomes the
    held status. True when it was written."""
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
    try:
        written = await asyncio.to_thread(
            kube.write_status, key.namespace, key.name, view.resource_version, status_json(status)
        )
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
    progress_seconds: float = 0.0,
    scraper: Scraper | None = None,
    pacer: ScrapePacer | None = None,
    catalog: PolicyCatalog | None = None,
) -> bool:
    """One reconcile; False once the job is gone (the daemon may end). `live` is kopf's live
    body of the job; progress numbers are written at most every `progress_seconds`; the
    agents are scraped, and sent live directives, through the operator's shared `scraper`
    (a session per round without one) as often as its `pacer` allows (every second
    without one); the job's platform policies come from `catalog` (none without one)."""
    view = await _view(kube, key, live, memory)
    if isinstance(view, bool):
        if not view:
            metrics.forget_job(key.namespace, key.name)
            if pacer is not None:
                pacer.forget((key.namespace, key.name))
        return view
    job, spec, status = view.job, view.spec, view.status
    ref = pods.JobRef(key.name, key.namespace, job["metadata"]["uid"])
    if not memory.base_ready:
        await asyncio.to_thread(ensure_base, kube, ref, memory)
    facts = _with_vanished(list(indexed), memory, status)
    _remember_nodes(memory, facts, status.attempt)
    scrapes = await _scrape(key, facts, status, memory, scraper=scraper, pacer=pacer)
    progress = _progress(memory, facts, scrapes, status.attempt)
    skip = _known_skip_ranges(status, memory)
    if skip is None:
        skip = await asyncio.to_thread(_read_skip_ranges, kube, key, status, memory)
    directives = memory.directives.get(status.attempt)
    if directives is None:
        directives = await asyncio.to_thread(_attempt_directives, kube, key, memory, status.attempt)
    ledger = PolicyLedger.from_job_status(status)
    target = await _effective(key, view, memory, catalog)
    generation = job["metadata"].get("generation")
    preflight_pod = None
    if needs_preflight_pod(spec, status):
        preflight_pod = await asyncio.to_thread(ensure_preflight_pod, kube, ref, spec, generation)
    world = World(
        now=datetime.now(UTC),
        job=key.name,
        spec=target.spec or spec,
        generation=generation,
        pods=tuple(facts),
        scrapes=scrapes,
        skip_ranges=skip,
        ledger=ledger,
        previous_nodes=tuple(memory.nodes.get(r) for r in range(spec.workers.nodes)),
        attempt_directives=directives,
        preflight_pod=preflight_pod,
        progress=progress,
        target=target,
    )
    transition = advance(status, world)
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
    for note in transition.deferred:
        _log.debug("job %s: %s", key.name, note.message)
    if transition.launch is not None:
        await asyncio.to_thread(launch, kube, ref, world.spec, transition.launch)
        if transition.launch.spill_skip_ranges is not None:
            memory.skip_ranges = None
    written = await _record(
        kube, key, view, transition.status, memory, progress_seconds=progress_seconds
    )
    if written and transition.status.phase is not status.phase:
        _log.info("job %s: %s -> %s", key.name, status.phase, transition.status.phase)
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
    for event in transition.events:
        await asyncio.to_thread(kube.event, job, event.type, event.reason, event.message)
    if remediation is not None and transition.status.suspect_nodes != status.suspect_nodes:
        await asyncio.to_thread(remediate, kube, remediation, key, status, transition.status)
    policy = transition.status.policy
    _record_metrics(key, policy.recovery if policy is not None else spec.recovery, transition)
    memory.next_tick_at = _next_tick_at(transition.status.phase, spec, memory, pacer)
    return True


def _next_tick_at(
    phase: Phase, spec: StableTrainingJobSpec, memory: JobMemory, pacer: ScrapePacer | None
) -> float:
    """A running job has nothing to do until its next round unless its world changes (the
    daemon ticks at once when its pods or its object change); the other phases, and a
    suspend waiting for its save, wait on time (backoff, grace periods, bounds) and tick on
    the daemon's clock."""
    if phase is Phase.RUNNING and not spec.suspend:
        return memory.last_scrape + _round_interval(memory, pacer)
    return 0.0
