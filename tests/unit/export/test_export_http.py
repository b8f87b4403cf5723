"""The agent's HTTP server on 127.0.0.1, driven through a plain blocking client."""

from __future__ import annotations

import http.client
import json
import math
import random
import socket
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client.metrics_core import Metric

from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.endpoint.exporter import AgentExporter
from stabletrain_contract.channel import (
    DIRECTIVES_HTTP_PATH,
    MAX_DIRECTIVES_BYTES,
    STATUS_HTTP_PATH,
    LiveOutcome,
    bearer,
    new_token,
    parse_directive_ack,
)
from stabletrain_contract.checkpoint.inventory import CheckpointRecord, NodeCopy, TierCopy
from stabletrain_contract.detection import CustomSignalConfig, DetectionConfig, ThresholdKind
from stabletrain_contract.directives import DEFAULT_TRIP_ON, Directives
from stabletrain_contract.names import AnomalyClass, Signal
from stabletrain_contract.signals.monitor import SignalMonitor, StepObservation
from stabletrain_contract.trip_report import TripReport
from support.agent_client import (
    AgentUnreachableError,
    fetch_metrics,
    fetch_status,
    put_directives,
    sample_value,
)

ATTEMPT = 1
TOKEN = new_token()


def _directives(generation: int, **fields: object) -> Directives:
    return Directives.model_validate(
        {"generation": generation, "attempt": ATTEMPT, "resumeStep": 200, **fields}
    )


@pytest.fixture
def source() -> DirectiveSource:
    return DirectiveSource(attempt=ATTEMPT, initial=_directives(1))


@pytest.fixture
def exporter(source: DirectiveSource) -> Iterator[AgentExporter]:
    exporter = AgentExporter(source=source, token=TOKEN, node="node-a", node_rank=0)
    exporter.start()
    try:
        yield exporter
    finally:
        exporter.stop()


def _feed(exporter: AgentExporter, source: DirectiveSource) -> SignalMonitor:
    """A real monitor over a run with a NaN step and a sustained spike, exported each step."""
    config = DetectionConfig(
        custom=(CustomSignalConfig(name="val_loss", kind=ThresholdKind.ABOVE, threshold=9.0),)
    )
    monitor = SignalMonitor(config, trip_on=DEFAULT_TRIP_ON)
    rng = random.Random(1)
    for step in range(320):
        loss = 2.0 * (1 + rng.gauss(0, 0.01))
        if step == 250:
            loss = math.nan
        if step >= 310:
            loss = 4.4
        verdict = monitor.observe(
            StepObservation(
                step=step,
                loss=loss,
                grad_norm=0.5,
                lr=2e-4,
                tokens_per_second=12_000.0,
                custom={"val_loss": 2.5},
                checkpoint_in_flight=False,
                steps_since_start=step,
            )
        )
        exporter.update(
            monitor.snapshot(), lr_scale=0.5, applied_generation=source.applied_generation
        )
        if verdict.trip:
            break
    return monitor


def _value(families: dict[str, Metric], metric: str, **labels: str) -> float:
    value = sample_value(families, metric, **labels)
    assert value is not None, f"no sample {metric}{labels}"
    return value


def test_the_server_keeps_the_connection_for_the_next_scrape(exporter: AgentExporter) -> None:
    """The operator scrapes each agent every second or few over one kept connection."""
    connection = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=5)

    def get() -> tuple[int, str | None]:
        connection.request("GET", STATUS_HTTP_PATH)
        response = connection.getresponse()
        response.read()
        return response.status, response.getheader("Connection")

    try:
        assert get() == (200, None)
        first = connection.sock
        assert get() == (200, None)
        assert connection.sock is first, "the second request needed a new connection"
    finally:
        connection.close()


def test_a_stopped_agent_answers_no_more_over_a_kept_connection(source: DirectiveSource) -> None:
    """Stopped serving means stopped: the operator reads a silent agent as one whose
    process is gone or frozen, so a kept connection must not keep answering."""
    exporter = AgentExporter(source=source, token=TOKEN, node="node-a", node_rank=0)
    exporter.start()
    connection = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=5)

    def get() -> bytes:
        connection.request("GET", STATUS_HTTP_PATH)
        return connection.getresponse().read()

    try:
        assert get()
        exporter.stop()
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            get()
    finally:
        connection.close()
        exporter.stop()


def test_a_refusal_that_left_the_body_unread_closes_the_connection(exporter: AgentExporter) -> None:
    """The next request would start inside the unread body; one that was read keeps it."""
    connection = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=5)
    body = _directives(2).to_json().encode()

    def put(token: str) -> tuple[int, str | None]:
        connection.request("PUT", DIRECTIVES_HTTP_PATH, body, {"Authorization": bearer(token)})
        response = connection.getresponse()
        response.read()
        return response.status, response.getheader("Connection")

    try:
        assert put(TOKEN) == (200, None)
        assert put("wrong") == (401, "close")
    finally:
        connection.close()


def test_a_client_that_expects_100_continue_gets_it_before_sending_the_body(
    exporter: AgentExporter,
) -> None:
    body = _directives(2).to_json().encode()
    with socket.create_connection(("127.0.0.1", exporter.port), timeout=5) as raw:
        raw.sendall(
            f"PUT {DIRECTIVES_HTTP_PATH} HTTP/1.1\r\nHost: agent\r\n"
            f"Authorization: {bearer(TOKEN)}\r\nExpect: 100-continue\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        assert raw.recv(64).startswith(b"HTTP/1.1 100 Continue")
        raw.sendall(body)
        assert raw.recv(4096).startswith(b"HTTP/1.1 200 OK")


def test_metrics_are_scraped_and_parsed_back_with_the_monitor_values(
    exporter: AgentExporter, source: DirectiveSource
) -> None:
    monitor = _feed(exporter, source)
    snapshot = monitor.snapshot()
    families = fetch_metrics(exporter.url)
    assert sorted(n for n in families if n.startswith("stabletrain_")) == sorted(families)
    assert snapshot.step == 313  # tripped after 4 sustained steps from 310
    assert _value(families, "stabletrain_step") == 313
    assert _value(families, "stabletrain_loss") == pytest.approx(4.4)
    assert _value(families, "stabletrain_loss_baseline") == pytest.approx(2.0, rel=0.02)
    assert _value(families, "stabletrain_grad_norm") == pytest.approx(0.5)
    assert _value(families, "stabletrain_grad_norm_baseline") == pytest.approx(0.5)
    assert _value(families, "stabletrain_learning_rate") == pytest.approx(2e-4)
    assert _value(families, "stabletrain_lr_scale_ratio") == pytest.approx(0.5)
    assert _value(families, "stabletrain_tokens_per_second") == pytest.approx(12_000.0)
    assert _value(families, "stabletrain_loss_spike_active") == 1
    assert _value(families, "stabletrain_loss_spike_consecutive_steps") == 4
    assert _value(families, "stabletrain_signal_consecutive_steps", signal="LossSpike") == 4
    assert _value(families, "stabletrain_signal_sustained", signal="LossSpike") == 1
    assert _value(families, "stabletrain_signal_sustained", signal="NonFinite") == 0
    assert _value(families, "stabletrain_non_finite_steps") == 1
    assert families["stabletrain_non_finite_steps"].type == "counter"
    assert _value(families, "stabletrain_anomaly_class", **{"class": "BadBatch"}) == 1
    assert _value(families, "stabletrain_anomaly_class", **{"class": "Numerical"}) == 0
    assert _value(families, "stabletrain_custom_signal", name="val_loss") == pytest.approx(2.5)
    assert _value(families, "stabletrain_directive_generation_applied") == 1
    assert _value(families, "stabletrain_trips") == 0
    assert sample_value(families, "stabletrain_custom_signal", name="never_reported") is None
    assert sample_value(families, "stabletrain_no_such_metric") is None


def test_the_anomaly_class_series_fall_back_to_zero_when_the_anomaly_ends(
    exporter: AgentExporter, source: DirectiveSource
) -> None:
    """The class series are only rewritten when the class changes; an end is a change."""
    snapshot = _feed(exporter, source).snapshot()
    assert snapshot.anomaly_class is not None
    quiet = snapshot._replace(anomaly_class=None)
    exporter.update(quiet, lr_scale=0.5, applied_generation=source.applied_generation)
    families = fetch_metrics(exporter.url)
    assert _value(families, "stabletrain_anomaly_class", **{"class": "BadBatch"}) == 0
    exporter.update(snapshot, lr_scale=0.5, applied_generation=source.applied_generation)
    families = fetch_metrics(exporter.url)
    assert _value(families, "stabletrain_anomaly_class", **{"class": "BadBatch"}) == 1


def test_a_scrape_shows_what_fired_between_scrapes_and_the_newest_custom_values(
    exporter: AgentExporter, source: DirectiveSource
) -> None:
    """The series are set when scraped, from the last published step: a signal that fired
    only at steps no scrape saw still keeps its series (at 0 once quiet), and a custom value
    reported at an earlier step than the last stays the newest value shown."""
    snapshot = _feed(exporter, source).snapshot()
    assert snapshot.findings
    assert snapshot.custom
    quiet = snapshot._replace(step=314, findings=(), custom={}, anomaly_class=None)
    exporter.update(quiet, lr_scale=0.5, applied_generation=source.applied_generation)
    families = fetch_metrics(exporter.url)
    assert _value(families, "stabletrain_step") == 314
    assert _value(families, "stabletrain_signal_consecutive_steps", signal="LossSpike") == 0
    assert _value(families, "stabletrain_signal_sustained", signal="LossSpike") == 0
    assert _value(families, "stabletrain_custom_signal", name="val_loss") == pytest.approx(2.5)
    assert _value(families, "stabletrain_non_finite_steps") == 1


def test_two_exporters_in_one_process_keep_separate_registries(source: DirectiveSource) -> None:
    first = AgentExporter(source=source, token=TOKEN, node="a", node_rank=0)
    second = AgentExporter(source=source, token=TOKEN, node="b", node_rank=1)
    with first, second:
        assert first.port != second.port
        first.record_trip(_trip())
        assert _value(fetch_metrics(first.url), "stabletrain_trips") == 1
        assert _value(fetch_metrics(second.url), "stabletrain_trips") == 0


def _trip() -> TripReport:
    return TripReport(
        attempt=ATTEMPT,
        node="node-a",
        step=313,
        tripped_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        signal=Signal.LOSS_SPIKE.value,
        anomaly_class=AnomalyClass.BAD_BATCH,
        evidence="loss 4.4 vs baseline 2.0",
        value=4.4,
        threshold=3.2,
        onset_step=310,
        last_good_step=309,
        inventory=((300, ATTEMPT, 61),),
    )


def test_json_status_carries_the_monitor_inventory_and_latest_trip(
    exporter: AgentExporter, source: DirectiveSource
) -> None:
    before = fetch_status(exporter.url)
    assert (before.step, before.loss, before.latest_trip) == (None, None, None)

    _feed(exporter, source)
    record = CheckpointRecord(
        step=300,
        attempt=ATTEMPT,
        stable=True,
        saved_at=datetime(2026, 1, 2, tzinfo=UTC),
        pfs=TierCopy(complete=True, verified=True),
        local=(NodeCopy(node="node-a", complete=True, verified=True),),
    )
    exporter.set_inventory([record])
    exporter.record_trip(_trip())
    status = fetch_status(exporter.url)
    assert (status.attempt, status.node, status.node_rank) == (ATTEMPT, "node-a", 0)
    assert status.step == 313
    assert status.loss == pytest.approx(4.4)
    assert status.lr_scale == 0.5
    assert status.applied_generation == 1
    assert status.inventory == (record,)
    assert status.latest_trip == _trip()
    (firing,) = status.firing
    assert (firing.signal, firing.anomaly_class, firing.onset_step, firing.sustained) == (
        Signal.LOSS_SPIKE.value,
        AnomalyClass.BAD_BATCH,
        310,
        True,
    )


def test_status_shows_a_nan_loss_as_news_not_an_encoding_error(
    exporter: AgentExporter, source: DirectiveSource
) -> None:
    monitor = SignalMonitor(DetectionConfig(), trip_on=DEFAULT_TRIP_ON)
    monitor.observe(
        StepObservation(
            step=0,
            loss=math.nan,
            grad_norm=math.inf,
            lr=1e-4,
            tokens_per_second=None,
            checkpoint_in_flight=False,
            steps_since_start=0,
        )
    )
    exporter.update(monitor.snapshot(), lr_scale=1.0, applied_generation=1)
    status = fetch_status(exporter.url)
    assert status.loss is not None
    assert math.isnan(status.loss)
    assert status.grad_norm == math.inf
    assert status.firing[0].signal == Signal.NON_FINITE.value


def test_put_with_the_good_token_applies_and_is_idempotent_by_generation(
    exporter: AgentExporter, source: DirectiveSource
) -> None:
    applied = put_directives(exporter.url, _directives(2, lrScale=0.5), TOKEN)
    assert applied.status == 200
    assert applied.ack.outcome is LiveOutcome.APPLIED
    assert applied.ack.applied_generation == 2
    latest = source.latest()
    assert latest is not None
    assert latest.lr_scale == 0.5

    retried = put_directives(exporter.url, _directives(2, lrScale=0.5), TOKEN)
    assert (retried.status, retried.ack.outcome) == (200, LiveOutcome.ALREADY_APPLIED)
    stale = put_directives(exporter.url, _directives(1, lrScale=0.1), TOKEN)
    assert (stale.status, stale.ack.outcome, stale.ack.applied_generation) == (
        200,
        LiveOutcome.ALREADY_APPLIED,
        2,
    )
    assert "not newer" in stale.ack.message
    fenced = put_directives(exporter.url, _directives(7, attempt=ATTEMPT + 1), TOKEN)
    assert (fenced.status, fenced.ack.outcome) == (409, LiveOutcome.WRONG_ATTEMPT)
    latest = source.latest()
    assert latest is not None
    assert (latest.generation, latest.lr_scale) == (2, 0.5)
    families = fetch_metrics(exporter.url)
    assert _value(families, "stabletrain_directive_requests", outcome="Applied") == 1
    assert _value(families, "stabletrain_directive_requests", outcome="AlreadyApplied") == 2
    assert _value(families, "stabletrain_directive_requests", outcome="WrongAttempt") == 1


@pytest.mark.parametrize("token", ["", "wrong", TOKEN + "x", TOKEN[:-1], TOKEN.upper()])
def test_put_with_a_bad_or_missing_token_is_refused_and_changes_nothing(
    exporter: AgentExporter, source: DirectiveSource, token: str
) -> None:
    result = put_directives(exporter.url, _directives(5, lrScale=0.1), token)
    assert result.status == 401
    assert result.ack.outcome is None
    assert "Authorization: Bearer" in result.ack.message
    assert source.applied_generation == 1


def _raw_put(exporter: AgentExporter, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=5)
    try:
        connection.putrequest("PUT", DIRECTIVES_HTTP_PATH)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _garbage_bodies() -> list[bytes]:
    rng = random.Random(1234)
    good = json.loads(_directives(9).to_json())
    bodies: list[bytes] = [
        b"",
        b"null",
        b"[]",
        b"{}",
        b"42",
        b'"directives"',
        b"{",
        b'{"generation": 9',
        b"\xff\xfe\x00garbage",
        b'{"generation": "nine", "attempt": 1}',
        b'{"generation": 0, "attempt": 1}',
        b'{"generation": -3, "attempt": 1}',
        b'{"generation": 9}',
        b'{"generation": 9, "attempt": 1, "lrScale": 1.5}',
        b'{"generation": 9, "attempt": 1, "lrScale": 0}',
        b'{"generation": 9, "attempt": 1, "lrScale": NaN}',
        b'{"generation": 9, "attempt": 1, "skip": [{"first": 10, "last": 2}]}',
        b'{"generation": 9, "attempt": 1, "tripOn": ["Stalled"]}',
        b'{"generation": 9, "attempt": 1, "tripOn": ["custom:undefined"]}',
        b'{"generation": 9, "attempt": 1, "detection": {"lossSpike": {"ratio": 0.5}}}',
        b'{"generation": 9, "attempt": 1, "unknownField": true}',
        b'{"generation": 1e400, "attempt": 1}',
        b"[" * 5000 + b"]" * 5000,
    ]
    for name in list(good):
        broken = dict(good)
        broken[name] = {"nested": [1, 2, {"x": None}]}
        bodies.append(json.dumps(broken).encode())
    while len(bodies) < 50:
        bodies.append(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))))
    return bodies


def test_fifty_garbage_bodies_are_answered_4xx_and_the_server_keeps_serving(
    exporter: AgentExporter, source: DirectiveSource
) -> None:
    bodies = _garbage_bodies()
    assert len(bodies) == 50
    headers = {"Authorization": bearer(TOKEN), "Content-Type": "application/json"}
    for body in bodies:
        status, answer = _raw_put(exporter, body, {**headers, "Content-Length": str(len(body))})
        assert status == 400, body[:80]
        ack = parse_directive_ack(answer)
        assert ack.message.startswith("expected Directives JSON"), ack.message
        assert ack.applied_generation == 1
    assert source.applied_generation == 1
    assert fetch_status(exporter.url).applied_generation == 1
    families = fetch_metrics(exporter.url)
    assert _value(families, "stabletrain_directive_requests", outcome="BadRequest") == 50


def test_a_bad_request_names_the_offending_field(exporter: AgentExporter) -> None:
    body = b'{"generation": 9, "attempt": 1, "lrScale": 1.5}'
    status, answer = _raw_put(
        exporter,
        body,
        {"Authorization": bearer(TOKEN), "Content-Length": str(len(body))},
    )
    assert status == 400
    assert "lrScale" in parse_directive_ack(answer).message


def test_transport_level_abuse_gets_clear_4xx_answers(exporter: AgentExporter) -> None:
    auth = {"Authorization": bearer(TOKEN)}
    status, answer = _raw_put(exporter, b"", auth)  # no Content-Length at all
    assert status == 411
    assert "Content-Length" in parse_directive_ack(answer).message
    status, answer = _raw_put(exporter, b"", {**auth, "Content-Length": "lots"})
    assert status == 400
    too_big = str(MAX_DIRECTIVES_BYTES + 1)
    status, answer = _raw_put(exporter, b"", {**auth, "Content-Length": too_big})
    assert status == 413
    assert "limit" in parse_directive_ack(answer).message

    connection = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=5)
    try:
        for method, path, expected in [
            ("GET", "/nope", 404),
            ("POST", DIRECTIVES_HTTP_PATH, 405),
            ("DELETE", "/metrics", 405),
        ]:
            connection.request(method, path)
            response = connection.getresponse()
            assert response.status == expected
            assert "error" in json.loads(response.read())
            connection.close()
    finally:
        connection.close()

    with socket.create_connection(("127.0.0.1", exporter.port), timeout=5) as raw:
        raw.sendall(b"\x16\x03\x01 this is not http\r\n\r\n")
        answer = b""
        while chunk := raw.recv(4096):
            answer += chunk
        assert b"Error code: 400" in answer  # the stdlib's answer to a non-HTTP request line
    assert fetch_status(exporter.url).node == "node-a"


def test_stop_releases_the_port_and_the_client_reports_an_unreachable_agent(
    source: DirectiveSource,
) -> None:
    exporter = AgentExporter(source=source, token=TOKEN, node="a", node_rank=0)
    exporter.stop()  # before start: harmless
    exporter.start()
    url = exporter.url
    port = exporter.port
    exporter.stop()
    exporter.stop()
    with pytest.raises(AgentUnreachableError, match=str(port)):
        fetch_status(url, timeout=2)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_only_local_rank_zero_serves(source: DirectiveSource) -> None:
    assert AgentExporter.from_env(source, {"LOCAL_RANK": "1"}) is None
    exporter = AgentExporter.from_env(
        source,
        {
            "LOCAL_RANK": "0",
            "STABLETRAIN_AGENT_PORT": "0",
            "STABLETRAIN_AGENT_BIND_ADDRESS": "127.0.0.2",
            "STABLETRAIN_NODE_NAME": "node-z",
            "STABLETRAIN_NODE_RANK": "3",
            "STABLETRAIN_DIRECTIVES_TOKEN": TOKEN,
        },
    )
    assert exporter is not None
    with exporter:
        assert exporter.url.startswith("http://127.0.0.2:")
        status = fetch_status(exporter.url)
        assert (status.node, status.node_rank) == ("node-z", 3)
        assert put_directives(exporter.url, _directives(2), TOKEN).status == 200
    with pytest.raises(ValueError, match="STABLETRAIN_AGENT_PORT"):
        AgentExporter.from_env(source, {"STABLETRAIN_AGENT_PORT": "http"})
