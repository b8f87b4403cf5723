"""The agent's one HTTP server: /metrics, the JSON status, and the live-directive PUT.

Local rank 0 of each pod serves it on the port the pod's env names, with the cross-rank
values the guard already holds, so exporting costs the training loop no extra sync. The
same module carries the small client the operator uses to scrape and to PUT, so both ends
of the channel are written (and tested) against each other.

Metric names follow Prometheus conventions: a ``stabletrain_`` prefix, base units, ratios
0-1, ``_total`` counters, and labels only with small fixed value sets (signal, anomaly
class, outcome), never per step or per sample. Each exporter owns a private registry, so
several exporters (tests, replay) can live in one process without colliding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import socket
import socketserver
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from stabletrain_agent.contract import env
from stabletrain_agent.contract.base import ContractError
from stabletrain_agent.contract.channel import (
    AUTHORIZATION_HEADER,
    DIRECTIVES_HTTP_PATH,
    HTTP_BAD_REQUEST,
    HTTP_OK,
    HTTP_TOO_LARGE,
    HTTP_UNAUTHORIZED,
    MAX_DIRECTIVES_BYTES,
    METRICS_HTTP_PATH,
    OUTCOME_STATUS,
    PFS_MESSAGE_MAX,
    STATUS_HTTP_PATH,
    AgentStatus,
    DirectiveAck,
    LiveOutcome,
    bearer,
    parse_agent_status,
    parse_directive_ack,
    token_matches,
)
from stabletrain_agent.contract.directives import Directives, parse_directives
from stabletrain_agent.contract.inventory import CheckpointRecord
from stabletrain_agent.contract.names import AnomalyClass, Signal
from stabletrain_agent.contract.preflight import PreflightFacts
from stabletrain_agent.contract.trip import TripReport
from stabletrain_agent.directives import DirectiveSource
from stabletrain_agent.heartbeat import HeartbeatClock
from stabletrain_agent.signals.monitor import Finding, MonitorSnapshot

_log = logging.getLogger(__name__)

HTTP_NOT_FOUND = 404
HTTP_METHOD_NOT_ALLOWED = 405
HTTP_LENGTH_REQUIRED = 411
HTTP_INTERNAL_ERROR = 500
REQUEST_TIMEOUT_SECONDS = 10.0
"""A client that stalls mid-request loses its connection instead of holding a thread."""
_GET_PATHS = f"{METRICS_HTTP_PATH} or {STATUS_HTTP_PATH}"
SHUTDOWN_POLL_SECONDS = 0.05
"""How often the serving thread checks for stop(): a stop returns within about this long."""


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
    latest_trip: TripReport | None = None
    preflight: PreflightFacts | None = None
    saved_request: int = 0
    saved_step: int | None = None
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
        rank: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._source = source
        self._token = token
        self._node = node
        self._node_rank = node_rank
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
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
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
        self._metrics.trips.inc()
        with self._parts_lock:
            self._parts = dataclasses.replace(self._parts, latest_trip=report)

    def set_inventory(self, records: Iterable[CheckpointRecord]) -> None:
        with self._parts_lock:
            self._parts = dataclasses.replace(
                self._parts,
                inventory=tuple(records),
                inventory_serial=self._parts.inventory_serial + 1,
            )

    def set_pfs(self, available: bool, message: str) -> None:
        """Whether this pod's last PFS write succeeded, and the error when it did not."""
        shown = "" if available else message[:PFS_MESSAGE_MAX]
        with self._parts_lock:
            self._parts = dataclasses.replace(
                self._parts,
                pfs_available=available,
                pfs_message=shown,
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
            latest_trip=parts.latest_trip,
            preflight=parts.preflight,
            heartbeat=self._heartbeat.read(),
            saved_request=parts.saved_request,
            saved_step=parts.saved_step,
        )

    @property
    def inventory_serial(self) -> int:
        return self._parts.inventory_serial

    def inventory_sent(self, serial: int) -> None:
        """A status showing the inventory and PFS condition of `serial` reached its client."""
        with self._sent:
            self._inventory_serial_sent = max(self._inventory_serial_sent, serial)
            self._sent.notify_all()

    def await_inventory_served(self, timeout: float) -> bool:
        """Wait until a status showing the current inventory was sent; False after `timeout`
        (at once when not serving).

        The guard's hand-over before the process ends: what it scanned last is then known to
        a client (the operator's scrape), not only to this process.
        """
        if self._server is None:
            return False
        serial = self.inventory_serial
        with self._sent:
            return self._sent.wait_for(lambda: self._inventory_serial_sent >= serial, timeout)

    def authorized(self, authorization: str | None) -> bool:
        """Constant-time check of a request's Authorization header against the job's token."""
        return token_matches(authorization, self._token)

    def receive_directives(self, body: bytes) -> tuple[int, DirectiveAck]:
        """Judge the body of an authorized PUT: the HTTP status and the acknowledgement."""
        try:
            incoming = parse_directives(body)
        except ContractError as error:
            return self.refuse(HTTP_BAD_REQUEST, "BadRequest", f"expected Directives JSON; {error}")
        result = self._source.offer(incoming)
        self._metrics.directive_requests.labels(result.outcome.value).inc()
        log = _log.info if result.outcome is LiveOutcome.APPLIED else _log.warning
        log("live directive: %s (%s)", result.outcome.value, result.message)
        return OUTCOME_STATUS[result.outcome], DirectiveAck(
            outcome=result.outcome,
            applied_generation=result.applied_generation,
            message=result.message,
        )

    def refuse(self, status: int, outcome: str, message: str) -> tuple[int, DirectiveAck]:
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
        server = _Server(self._address, _Handler, self)
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
            name="stabletrain-exporter",
            daemon=True,
        )
        thread.start()
        self._server, self._thread = server, thread

    def stop(self) -> None:
        """Stop serving and release the port; safe to call twice or before start."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.end_open_connections()
            server.server_close()
        if thread is not None:
            thread.join()

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


class _Server(ThreadingHTTPServer):
    """Keeps each connection for the next scrape (HTTP/1.1), and ends the kept ones when it
    stops: an agent that stopped serving must not go on answering over them."""

    daemon_threads = True
    block_on_close = True

    def __init__(
        self, address: tuple[str, int], handler: type[_Handler], exporter: AgentExporter
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.exporter = exporter
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        with self._open_lock:
            self._open.add(connection)
        return connection, address

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def end_open_connections(self) -> None:
        with self._open_lock:
            connections, self._open = self._open, set()
        for connection in connections:
            with contextlib.suppress(OSError):  # the client may have gone already
                connection.shutdown(socket.SHUT_RDWR)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can stall on DNS; the name
        # is never used here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        _log.exception("agent HTTP server: error while serving %s", client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_SECONDS
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_PUT(self) -> None:
        self._guarded(self._put)

    def do_POST(self) -> None:
        self._not_allowed()

    def do_DELETE(self) -> None:
        self._not_allowed()

    def do_PATCH(self) -> None:
        self._not_allowed()

    def _guarded(self, serve: Callable[[], None]) -> None:
        """No request, however malformed, may take the server (or training) down."""
        try:
            serve()
        except Exception:
            _log.exception("agent HTTP server: %s %s failed", self.command, self.path)
            self.close_connection = True
            self._send_json(HTTP_INTERNAL_ERROR, {"error": "internal error; see the agent log"})

    def _get(self) -> None:
        exporter = self.server.exporter
        path = self.path.split("?", 1)[0]
        if path == METRICS_HTTP_PATH:
            self._send(HTTP_OK, CONTENT_TYPE_LATEST, generate_latest(exporter.registry))
        elif path == STATUS_HTTP_PATH:
            exporter.refresh_status()
            serial = exporter.inventory_serial  # read first: the status shows this or newer
            body = exporter.status().model_dump_json().encode()
            self._send(HTTP_OK, "application/json", body)
            exporter.inventory_sent(serial)
        else:
            self._send_json(
                HTTP_NOT_FOUND,
                {"error": f"no such path {path!r}; expected {_GET_PATHS}"},
            )

    def _put(self) -> None:
        exporter = self.server.exporter
        path = self.path.split("?", 1)[0]
        if path != DIRECTIVES_HTTP_PATH:
            self.close_connection = True
            self._send_json(
                HTTP_NOT_FOUND, {"error": f"no such path {path!r}; expected {DIRECTIVES_HTTP_PATH}"}
            )
            return
        if not exporter.authorized(self.headers.get(AUTHORIZATION_HEADER)):
            self.close_connection = True  # the body is never read
            self._send_ack(
                *exporter.refuse(
                    HTTP_UNAUTHORIZED,
                    "Unauthorized",
                    "expected header 'Authorization: Bearer <token>' with the job's token",
                )
            )
            return
        body = self._read_body()
        if body is not None:
            self._send_ack(*exporter.receive_directives(body))

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering why it cannot be read."""
        exporter = self.server.exporter
        raw = self.headers.get("Content-Length")
        if raw is None or "chunked" in self.headers.get("Transfer-Encoding", ""):
            self.close_connection = True
            self._send_ack(
                *exporter.refuse(
                    HTTP_LENGTH_REQUIRED, "LengthRequired", "expected a Content-Length header"
                )
            )
            return None
        if not raw.strip().isdigit():
            self.close_connection = True
            self._send_ack(
                *exporter.refuse(
                    HTTP_BAD_REQUEST,
                    "BadRequest",
                    f"Content-Length must be a byte count, got {raw!r}",
                )
            )
            return None
        length = int(raw)
        if length > MAX_DIRECTIVES_BYTES:
            self.close_connection = True
            self._send_ack(
                *exporter.refuse(
                    HTTP_TOO_LARGE,
                    "TooLarge",
                    f"body of {length} bytes exceeds the {MAX_DIRECTIVES_BYTES}-byte limit",
                )
            )
            return None
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            self._send_ack(
                *exporter.refuse(
                    HTTP_BAD_REQUEST,
                    "BadRequest",
                    f"body ended after {len(body)} of {length} announced bytes",
                )
            )
            return None
        return body

    def _not_allowed(self) -> None:
        self.close_connection = True
        self._send_json(
            HTTP_METHOD_NOT_ALLOWED,
            {"error": f"method {self.command} not allowed; expected GET or PUT"},
            extra_headers={"Allow": "GET, PUT"},
        )

    def _send_ack(self, status: int, ack: DirectiveAck) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if status == HTTP_UNAUTHORIZED else {}
        self._send(status, "application/json", ack.model_dump_json().encode(), headers)

    def _send_json(
        self,
        status: int,
        payload: Mapping[str, str],
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        self._send(status, "application/json", json.dumps(payload).encode(), extra_headers)

    def _send(
        self,
        status: int,
        content_type: str,
        body: bytes,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra_headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("agent HTTP: " + format, *args)


def _set(gauge: Gauge, value: float | None) -> None:
    gauge.set(math.nan if value is None else value)


# --- the operator's side of the channel ------------------------------------------------


class AgentUnreachableError(ConnectionError):
    """The agent did not answer (pod gone, port closed, timeout); worth a retry."""


@dataclasses.dataclass(frozen=True)
class PutResult:
    status: int
    ack: DirectiveAck


def fetch_status(base_url: str, timeout: float = 5.0) -> AgentStatus:
    """GET the agent's status; ContractError names each bad field of a malformed answer."""
    status, body = _request("GET", base_url + STATUS_HTTP_PATH, timeout=timeout)
    if status != HTTP_OK:
        raise ContractError(f"status endpoint answered HTTP {status}: {body[:200]!r}")
    return parse_agent_status(body)


def fetch_metrics(base_url: str, timeout: float = 5.0) -> dict[str, Metric]:
    """Scrape /metrics and parse it back into metric families keyed by name."""
    status, body = _request("GET", base_url + METRICS_HTTP_PATH, timeout=timeout)
    if status != HTTP_OK:
        raise ContractError(f"metrics endpoint answered HTTP {status}: {body[:200]!r}")
    try:
        families = text_string_to_metric_families(body.decode())
        return {family.name: family for family in families}
    except (ValueError, UnicodeDecodeError) as error:
        raise ContractError(f"metrics payload is not Prometheus text format: {error}") from None


def sample_value(families: Mapping[str, Metric], metric: str, **labels: str) -> float | None:
    """The value of one series from ``fetch_metrics``; None when the agent does not export it.

    Counters are looked up by family name (``stabletrain_trips``) and found under their
    ``_total`` sample name, so callers never spell the suffix.
    """
    family = families.get(metric)
    if family is None:
        return None
    for sample in family.samples:
        if sample.name in (metric, metric + "_total") and sample.labels == labels:
            return float(sample.value)
    return None


def put_directives(
    base_url: str, directives: Directives, token: str, timeout: float = 5.0
) -> PutResult:
    """PUT live directives; retry blindly until ``ack.applied_generation`` is the one sent."""
    status, body = _request(
        "PUT",
        base_url + DIRECTIVES_HTTP_PATH,
        timeout=timeout,
        body=directives.to_json().encode(),
        headers={AUTHORIZATION_HEADER: bearer(token), "Content-Type": "application/json"},
    )
    return PutResult(status=status, ack=parse_directive_ack(body))


def _request(
    method: str,
    url: str,
    *,
    timeout: float,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return int(error.code), bytes(error.read())
    except (urllib.error.URLError, OSError) as error:
        raise AgentUnreachableError(f"agent at {url} did not answer: {error}") from None
