"""What the agent's one HTTP server shows and takes: metrics, status, live directives.

Local rank 0 of each pod serves it on the port the pod's env names, with the cross-rank
values the guard already holds, so exporting costs the training loop no extra sync. Which
path answers what is `stabletrain_agent.endpoint.routes`; the server itself,
`stabletrain_agent.endpoint.http_server`.

Metric names follow Prometheus conventions: a ``stabletrain_`` prefix, base units, ratios
0-1, ``_total`` counters, and labels only with small fixed value sets (signal, anomaly
class, outcome), never per step or per sample. Each exporter owns a private registry, so
several exporters (tests, replay) can live in one process without colliding.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from http import HTTPStatus
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import Metric

from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.endpoint.heartbeat import HeartbeatClock
from stabletrain_agent.endpoint.http_server import KeepAliveWSGIServer
from stabletrain_agent.endpoint.routes import agent_app
from stabletrain_contract import env
from stabletrain_contract.base import ContractError
from stabletrain_contract.channel import (
    OUTCOME_STATUS,
    PFS_MESSAGE_MAX,
    REJECTED_MAX,
    AgentStatus,
    DirectiveAck,
    LiveOutcome,
    RejectedCopy,
    status_credential,
    token_matches,
)
from stabletrain_contract.checkpoint.inventory import INVENTORY_MAX, CheckpointRecord
from stabletrain_contract.directives import parse_directives
from stabletrain_contract.names import AnomalyClass, Signal
from stabletrain_contract.preflight import PreflightFacts
from stabletrain_contract.signals.monitor import Finding, MonitorSnapshot
from stabletrain_contract.trip_report import (
    TripReport,
    parse_termination_message,
    render_termination_message,
)

_log = logging.getLogger(__name__)


class _Metrics:
    """Every series the exporter publishes, registered in one private registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str, labels: Iterable[str] = ()) -> Gauge:
            return Gauge(name, doc, labelnames=tuple(labels), registry=registry)

        self.step = gauge("stabletrain_step", "Global optimizer step last finished.")
        self.loss = gauge("stabletrain_loss", "Loss averaged across all ranks (NaN if non-finite).")
        self.loss_baseline = gauge(
            "stabletrain_loss_baseline", "EMA of healthy losses the spike rules compare with."
        )
        self.grad_norm = gauge("stabletrain_grad_norm", "Total pre-clip gradient norm.")
        self.grad_norm_baseline = gauge(
            "stabletrain_grad_norm_baseline", "EMA of healthy gradient norms."
        )
        self.learning_rate = gauge(
            "stabletrain_learning_rate", "Effective LR of param group 0 after directives."
        )
        self.lr_scale = gauge(
            "stabletrain_lr_scale_ratio", "LR multiplier the directives in force impose (0-1]."
        )
        self.tokens_per_second = gauge("stabletrain_tokens_per_second", "Training throughput.")
        self.tokens_per_second_baseline = gauge(
            "stabletrain_tokens_per_second_baseline", "EMA of healthy throughput."
        )
        self.spike_active = gauge(
            "stabletrain_loss_spike_active", "1 while the loss is above its spike threshold."
        )
        self.spike_consecutive = gauge(
            "stabletrain_loss_spike_consecutive_steps", "Consecutive steps of the current spike."
        )
        self.signal_consecutive = gauge(
            "stabletrain_signal_consecutive_steps",
            "Consecutive anomalous steps per signal (0 when the signal is quiet).",
            ["signal"],
        )
        self.signal_sustained = gauge(
            "stabletrain_signal_sustained",
            "1 while a signal has fired for its required consecutive steps.",
            ["signal"],
        )
        self.anomaly_class = gauge(
            "stabletrain_anomaly_class",
            "1 for the attribution class of the current sustained anomaly, 0 for the others.",
            ["class"],
        )
        self.custom = gauge(
            "stabletrain_custom_signal", "Latest value of each custom signal.", ["name"]
        )
        self.generation = gauge(
            "stabletrain_directive_generation_applied", "Directive generation the run applies."
        )
        self.non_finite = Counter(
            "stabletrain_non_finite_steps",
            "Steps whose loss or grad norm was NaN or infinite (update skipped).",
            registry=registry,
        )
        self.trips = Counter(
            "stabletrain_trips", "Times training was stopped by a trip.", registry=registry
        )
        self.directive_requests = Counter(
            "stabletrain_directive_requests",
            "Live-directive PUTs by outcome.",
            ["outcome"],
            registry=registry,
        )
        # The labelled series the training thread sets on every step, looked up once:
        # ``labels()`` validates and locks on each call, several microseconds a series.
        self.anomaly_classes = {a: self.anomaly_class.labels(a.value) for a in AnomalyClass}
        self._signal_series: dict[str, tuple[Gauge, Gauge]] = {}
        self._custom_series: dict[str, Gauge] = {}
        for child in self.anomaly_classes.values():
            child.set(0)
        for signal in (Signal.LOSS_SPIKE, Signal.GRAD_NORM_SPIKE, Signal.NON_FINITE):
            consecutive, sustained = self.signal_series(signal.value)
            consecutive.set(0)
            sustained.set(0)

    def signal_series(self, signal: str) -> tuple[Gauge, Gauge]:
        """(consecutive steps, sustained) of one signal."""
        series = self._signal_series.get(signal)
        if series is None:
            series = (self.signal_consecutive.labels(signal), self.signal_sustained.labels(signal))
            self._signal_series[signal] = series
        return series

    def custom_series(self, name: str) -> Gauge:
        series = self._custom_series.get(name)
        if series is None:
            series = self._custom_series[name] = self.custom.labels(name)
        return series


class _Published(NamedTuple):
    """One step as the training thread published it, swapped as one reference (a tuple:
    built on every step, where a frozen dataclass costs several times more)."""

    snapshot: MonitorSnapshot | None
    lr_scale: float
    applied_generation: int


@dataclasses.dataclass(frozen=True)
class _StatusParts:
    """What the status endpoint shows besides the step, swapped as one reference; the
    rare writers (trips, inventory, PFS, saves, preflight) take the lock."""

    inventory: tuple[CheckpointRecord, ...] = ()
    pfs_available: bool | None = None
    pfs_message: str = ""
    replicating: tuple[int, ...] | None = None
    latest_trip: TripReport | None = None
    preflight: PreflightFacts | None = None
    saved_request: int = 0
    saved_step: int | None = None
    rejected: tuple[RejectedCopy, ...] = ()
    inventory_serial: int = 0
    """Grows with every inventory or PFS condition set (see `await_inventory_served`)."""


class AgentExporter:
    """Metrics, status and live directives of one pod, served on one port."""

    def __init__(
        self,
        *,
        source: DirectiveSource,
        token: str,
        node: str,
        node_rank: int,
        pod: str | None = None,
        rank: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._source = source
        self._token = token
        self._status_credential = status_credential(token) if token else ""
        self._node = node
        self._node_rank = node_rank
        self._pod = pod
        self._address = (host, port)
        self._clock = clock
        self._heartbeat = HeartbeatClock(
            rank=node_rank if rank is None else rank, clock=clock, thread=threading.get_ident()
        )
        self._series = CollectorRegistry(auto_describe=True)
        self._metrics = _Metrics(self._series)
        self.registry = CollectorRegistry(auto_describe=True)
        """What /metrics serves: the series above, brought up to the last published step
        whenever it is collected (see `_render_metrics`)."""
        self.registry.register(_RenderedAtCollect(self._render_metrics, self._series))
        self._render_lock = threading.Lock()
        self._anomaly_shown: AnomalyClass | None = None
        """The class the anomaly-class series show (all 0: None)."""
        self._published = _Published(None, 1.0, source.applied_generation)
        self._rendered: _Published | None = None
        self._parts = _StatusParts()
        self._parts_lock = threading.Lock()
        self._signals_fired: set[str] = set()
        """Every signal a published step had firing: its series stay, at 0 when quiet."""
        self._custom_latest: dict[str, float] = {}
        """The newest published value of each custom signal (steps report them sparsely)."""
        self._non_finite_seen = 0
        self._server: KeepAliveWSGIServer | None = None
        self.before_status: Callable[[], None] | None = None
        """Run before each status is served (the guard re-scans an inventory in flight)."""
        self._sent = threading.Condition()
        self._inventory_serial_sent = 0

    @classmethod
    def from_env(
        cls, source: DirectiveSource, environ: Mapping[str, str] | None = None
    ) -> AgentExporter | None:
        """The exporter the pod's env describes, or None on any local rank but 0."""
        environ = os.environ if environ is None else environ
        if environ.get(env.LOCAL_RANK, "0") != "0":
            return None
        raw_port = environ.get(env.AGENT_PORT, str(env.DEFAULT_AGENT_PORT))
        if not raw_port.isdigit() or int(raw_port) > 65535:
            raise ValueError(f"{env.AGENT_PORT} must be a port number 0-65535, got {raw_port!r}")
        raw_rank = environ.get(env.NODE_RANK, "0")
        if not raw_rank.isdigit():
            raise ValueError(f"{env.NODE_RANK} must be a non-negative integer, got {raw_rank!r}")
        raw_global = environ.get(env.RANK, raw_rank)
        if not raw_global.isdigit():
            raise ValueError(f"{env.RANK} must be a non-negative integer, got {raw_global!r}")
        return cls(
            source=source,
            token=environ.get(env.DIRECTIVES_TOKEN, ""),
            node=environ.get(env.NODE_NAME) or socket.gethostname(),
            node_rank=int(raw_rank),
            pod=environ.get(env.POD_NAME) or socket.gethostname(),
            rank=int(raw_global),
            host=environ.get(env.AGENT_BIND_ADDRESS, env.DEFAULT_AGENT_BIND_ADDRESS),
            port=int(raw_port),
        )

    # --- the training side: called by the guard on local rank 0 ---------------------

    def update(
        self, snapshot: MonitorSnapshot, *, lr_scale: float, applied_generation: int
    ) -> None:
        """Publish one step's monitor state and the directives the run now applies; the
        calling thread is the training thread the heartbeat watches.

        The training thread only stamps the heartbeat and swaps one reference (plus the
        rare firing signal or custom value): the Prometheus series are set from it by the
        thread that serves /metrics, when it is scraped. Setting some twenty series on every
        step cost the training thread ~0.1 ms a step inside a framework's fit.
        """
        if snapshot.step is not None:
            self._heartbeat.completed(snapshot.step)
        if snapshot.findings:
            self._signals_fired.update(f.signal for f in snapshot.findings)
        if snapshot.custom:
            self._custom_latest.update(snapshot.custom)
        self._published = _Published(snapshot, lr_scale, applied_generation)

    def _render_metrics(self) -> None:
        """Set the series from the last published step (the scraping thread, per collect)."""
        with self._render_lock:
            published = self._published
            if published is self._rendered or published.snapshot is None:
                return
            self._rendered = published
            snapshot, m = published.snapshot, self._metrics
            _set(m.step, snapshot.step)
            _set(m.loss, snapshot.loss)
            _set(m.loss_baseline, snapshot.loss_baseline)
            _set(m.grad_norm, snapshot.grad_norm)
            _set(m.grad_norm_baseline, snapshot.grad_norm_baseline)
            _set(m.learning_rate, snapshot.lr)
            m.lr_scale.set(published.lr_scale)
            _set(m.tokens_per_second, snapshot.tokens_per_second)
            _set(m.tokens_per_second_baseline, snapshot.throughput_baseline)
            m.spike_active.set(1 if snapshot.spike_active else 0)
            m.spike_consecutive.set(snapshot.consecutive_spike_steps)
            self._render_signals(snapshot.findings)
            if snapshot.anomaly_class is not self._anomaly_shown:
                for anomaly, series in m.anomaly_classes.items():
                    series.set(1 if snapshot.anomaly_class is anomaly else 0)
                self._anomaly_shown = snapshot.anomaly_class
            for name, value in list(self._custom_latest.items()):
                m.custom_series(name).set(value)
            m.generation.set(published.applied_generation)
            if snapshot.non_finite_total > self._non_finite_seen:
                m.non_finite.inc(snapshot.non_finite_total - self._non_finite_seen)
            self._non_finite_seen = snapshot.non_finite_total

    def record_trip(self, report: TripReport) -> None:
        """Show the trip as its termination message holds it (cut to 4 KiB), so that the
        status stays within what the operator reads (MAX_STATUS_BYTES)."""
        self._metrics.trips.inc()
        fitted = parse_termination_message(render_termination_message(report))
        with self._parts_lock:
            self._parts = dataclasses.replace(self._parts, latest_trip=fitted)

    def set_inventory(self, records: Iterable[CheckpointRecord]) -> None:
        """The checkpoints to show: the newest INVENTORY_MAX (the operator keeps no more)."""
        newest = sorted(records, key=lambda record: (record.step, record.attempt))
        with self._parts_lock:
            self._parts = dataclasses.replace(
                self._parts,
                inventory=tuple(newest[-INVENTORY_MAX:]),
                inventory_serial=self._parts.inventory_serial + 1,
            )

    def set_rejected(self, copies: Iterable[RejectedCopy]) -> None:
        """Checkpoint copies this process refused, for the operator's Events (the newest
        REJECTED_MAX)."""
        shown = tuple(copies)[-REJECTED_MAX:]
        with self._parts_lock:
            self._parts = dataclasses.replace(self._parts, rejected=shown)

    def set_pfs(
        self, available: bool, message: str, replicating: Sequence[int] | None = None
    ) -> None:
        """Whether this pod's last PFS write succeeded, the error when it did not, and the
        steps it still has to write there (None: it does not say)."""
        shown = "" if available else message[:PFS_MESSAGE_MAX]
        sending = None if replicating is None else tuple(replicating)[:INVENTORY_MAX]
        with self._parts_lock:
            self._parts = dataclasses.replace(
                self._parts,
                pfs_available=available,
                pfs_message=shown,
                replicating=sending,
                inventory_serial=self._parts.inventory_serial + 1,
            )

    def set_saved(self, request: int, step: int | None) -> None:
        """A save request answered: the step saved and flushed, or None when none was."""
        with self._parts_lock:
            self._parts = dataclasses.replace(self._parts, saved_request=request, saved_step=step)

    def began_training(self, at: datetime) -> None:
        """The restore finished at `at` (the heartbeat's start-up is measured from then)."""
        self._heartbeat.began_training(at)

    def set_preflight(self, facts: PreflightFacts) -> None:
        """The run's start-up facts, shown in the status endpoint for the operator's checklist."""
        with self._parts_lock:
            self._parts = dataclasses.replace(self._parts, preflight=facts)

    def _render_signals(self, findings: tuple[Finding, ...]) -> None:
        """Per-signal gauges; a signal seen once keeps its series, reset to 0 when quiet."""
        firing = {f.signal: f for f in findings}
        for signal in tuple(self._signals_fired):
            finding = firing.get(signal)
            consecutive = 0 if finding is None else finding.consecutive
            sustained = finding is not None and finding.sustained
            consecutive_series, sustained_series = self._metrics.signal_series(signal)
            consecutive_series.set(consecutive)
            sustained_series.set(1 if sustained else 0)

    # --- what the HTTP side reads ----------------------------------------------------

    def refresh_status(self) -> None:
        """Bring the parts up to date that the training thread cannot (before_status)."""
        if self.before_status is None:
            return
        try:
            self.before_status()
        except Exception as error:  # the status must be served whatever a disk throws
            _log.warning("status refresh failed: %r", error)

    def status(self) -> AgentStatus:
        """The status document as GET /v1/status serves it."""
        # The step first: a step the parts must accompany (the tripping one comes after
        # its trip report) is then never shown with older parts.
        published = self._published
        parts = self._parts
        snap = published.snapshot
        return AgentStatus(
            attempt=self._source.attempt,
            node=self._node,
            node_rank=self._node_rank,
            pod=self._pod,
            updated_at=self._clock(),
            step=None if snap is None else snap.step,
            loss=None if snap is None else snap.loss,
            loss_baseline=None if snap is None else snap.loss_baseline,
            grad_norm=None if snap is None else snap.grad_norm,
            grad_norm_baseline=None if snap is None else snap.grad_norm_baseline,
            lr_scale=published.lr_scale,
            tokens_per_second=None if snap is None else snap.tokens_per_second,
            applied_generation=published.applied_generation,
            firing=() if snap is None else tuple(f.to_report() for f in snap.findings),
            inventory=parts.inventory,
            pfs_available=parts.pfs_available,
            pfs_message=parts.pfs_message,
            replicating=parts.replicating,
            latest_trip=parts.latest_trip,
            preflight=parts.preflight,
            heartbeat=self._heartbeat.read(),
            saved_request=parts.saved_request,
            saved_step=parts.saved_step,
            rejected=parts.rejected,
        )

    @property
    def inventory_serial(self) -> int:
        return self._parts.inventory_serial

    def inventory_sent(self, serial: int) -> None:
        """A status showing the inventory and PFS condition of `serial` reached the operator."""
        with self._sent:
            self._inventory_serial_sent = max(self._inventory_serial_sent, serial)
            self._sent.notify_all()

    def await_inventory_served(self, timeout: float) -> bool:
        """Wait until a status showing the current inventory was sent; False after `timeout`
        (at once when not serving).

        The guard's hand-over before the process ends: what it scanned last is then known to
        the operator, not only to this process. Only the operator's own reads count (they
        carry the status credential, `operator_reading`): anyone can read the status, and a
        read by another pod must not end the hand-over before the operator saw it.
        """
        if self._server is None:
            return False
        serial = self.inventory_serial
        with self._sent:
            return self._sent.wait_for(lambda: self._inventory_serial_sent >= serial, timeout)

    def authorized(self, authorization: str | None) -> bool:
        """Constant-time check of a request's Authorization header against the job's token."""
        return token_matches(authorization, self._token)

    def operator_reading(self, authorization: str | None) -> bool:
        """Whether a status GET is the operator's: it presents the status credential."""
        return token_matches(authorization, self._status_credential)

    def receive_directives(self, body: bytes) -> tuple[HTTPStatus, DirectiveAck]:
        """Judge the body of an authorized PUT: the HTTP status and the acknowledgement."""
        try:
            incoming = parse_directives(body)
        except ContractError as error:
            message = f"expected Directives JSON; {error}"
            return self.refuse(HTTPStatus.BAD_REQUEST, "BadRequest", message)
        result = self._source.offer(incoming)
        self._metrics.directive_requests.labels(result.outcome.value).inc()
        log = _log.info if result.outcome is LiveOutcome.APPLIED else _log.warning
        log("live directive: %s (%s)", result.outcome.value, result.message)
        return OUTCOME_STATUS[result.outcome], DirectiveAck(
            outcome=result.outcome,
            applied_generation=result.applied_generation,
            message=result.message,
        )

    def refuse(
        self, status: HTTPStatus, outcome: str, message: str
    ) -> tuple[HTTPStatus, DirectiveAck]:
        """A request refused before it was judged, counted and logged with the reason."""
        self._metrics.directive_requests.labels(outcome).inc()
        _log.warning("live directive refused (%d): %s", status, message)
        ack = DirectiveAck(applied_generation=self._source.applied_generation, message=message)
        return status, ack

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Bind and serve in a daemon thread; the bound port is known when this returns."""
        if self._server is not None:
            raise RuntimeError("exporter already started")
        if not self._token:
            _log.warning(
                "%s is empty: every live directive will be refused with 401",
                env.DIRECTIVES_TOKEN,
            )
        server = KeepAliveWSGIServer(self._address, agent_app(self))
        server.serve_in_background("stabletrain-exporter")
        self._server = server

    def stop(self) -> None:
        """Stop serving and release the port; safe to call twice or before start."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("exporter not started: no port bound yet")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._address[0]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}"

    def __enter__(self) -> AgentExporter:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class _RenderedAtCollect:
    """A collector that brings the series up to date, then yields them (see update())."""

    def __init__(self, render: Callable[[], None], series: CollectorRegistry) -> None:
        self._render = render
        self._series = series

    def describe(self) -> Iterable[Metric]:
        return self._series.collect()

    def collect(self) -> Iterable[Metric]:
        self._render()
        return self._series.collect()


def _set(gauge: Gauge, value: float | None) -> None:
    gauge.set(math.nan if value is None else value)
