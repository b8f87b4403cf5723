"""100 malformed or hostile agent status payloads from a real local HTTP server: every one
becomes a counted, logged scrape error, none raises, and a good pod among them is read."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler

import pytest

from stabletrain_contract.channel import MAX_STATUS_BYTES
from stabletrain_operator.observe.scrape import ScrapeError, ScrapeTarget, scrape_all
from support.loopback_http import serving

GOOD = {
    "attempt": 0,
    "node": "node-a",
    "nodeRank": 0,
    "updatedAt": datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
    "step": 12,
    "lrScale": 1.0,
    "appliedGeneration": 1,
}

Reply = Callable[[BaseHTTPRequestHandler], None]


def _send(code: int, body: bytes, content_type: str = "application/json") -> Reply:
    def reply(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(code)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return reply


def _json(value: object, code: int = 200) -> Reply:
    return _send(code, json.dumps(value).encode())


def _with(**changes: object) -> Reply:
    return _json({**GOOD, **changes})


def _without(field: str) -> Reply:
    return _json({k: v for k, v in GOOD.items() if k != field})


def _slow(handler: BaseHTTPRequestHandler) -> None:
    time.sleep(3.0)
    _json(GOOD)(handler)


def _dribble(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    for _ in range(40):
        handler.wfile.write(b" ")
        handler.wfile.flush()
        time.sleep(0.1)


def _hang_up(handler: BaseHTTPRequestHandler) -> None:
    handler.close_connection = True
    handler.connection.close()


def _huge(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.end_headers()
    chunk = b"[" * 65536
    for _ in range(MAX_STATUS_BYTES // len(chunk) + 4):
        handler.wfile.write(chunk)


def _cases() -> list[Reply]:
    fixed: list[Reply] = [
        _send(200, b"not json at all"),
        _send(200, b'{"attempt": 0, "node": '),
        _send(200, b""),
        _send(200, b"\xff\xfe\xfd garbage"),
        _send(200, b"null"),
        _json([GOOD]),
        _json("a string"),
        _json(12),
        _send(200, b"[" * 10000 + b"]" * 10000),
        _send(200, b"# HELP stabletrain_step\nstabletrain_step 3\n", "text/plain"),
        _json(GOOD, code=500),
        _json(GOOD, code=404),
        _json(GOOD, code=401),
        _json(GOOD, code=302),
        _slow,
        _dribble,
        _hang_up,
        _huge,
        _with(attempt=7),
        _with(attempt=-1),
        _with(step=-5),
        _with(step="twelve"),
        _with(step=1.5),
        _with(lrScale=0),
        _with(lrScale=2.0),
        _with(lrScale="NaN"),
        _with(nodeRank=-1),
        _with(node=""),
        _with(node="x" * 300),
        _with(updatedAt="yesterday"),
        _with(updatedAt="2026-01-01T00:00:00"),
        _with(appliedGeneration=-1),
        _with(rejected=[{"path": "/stabletrain/local/node-0/step-0000000010/attempt-0"}]),
        _with(firing=[{"signal": "NoSuchSignal"}]),
        _with(firing="LossSpike"),
        _with(
            firing=[
                {
                    "signal": "LossSpike",
                    "anomalyClass": "Gremlins",
                    "onsetStep": 1,
                    "consecutive": 1,
                    "sustained": True,
                }
            ]
        ),
        _with(inventory=[{"step": 1}]),
        _with(inventory={"step": 1}),
        _with(latestTrip={"signal": "LossSpike"}),
        _with(latestTrip=[]),
    ]
    fields = [f for f in GOOD if f not in ("step",)]
    missing = [_without(field) for field in fields]
    wrong_types: list[Reply] = [
        _with(**{field: value})
        for field in ("attempt", "nodeRank", "appliedGeneration", "lrScale", "loss", "step")
        for value in ({}, [], "x", "1.0.0")
    ]
    cases = fixed + missing + wrong_types
    padding = [_with(attempt=10 + i) for i in range(100 - len(cases))]
    return (cases + padding)[:100]


CASES = _cases()


class _Hostile(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        name = self.path.split("/")[1]
        if name == "good":
            _json(GOOD)(self)
            return
        CASES[int(name.removeprefix("case-"))](self)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def hostile_server() -> Iterator[str]:
    with serving(_Hostile) as url:
        yield url


def test_hundred_hostile_payloads_are_counted_and_logged(
    hostile_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert len(CASES) == 100
    targets = [ScrapeTarget(f"case-{i}", f"{hostile_server}/case-{i}", 0) for i in range(100)]
    targets.append(ScrapeTarget("good", f"{hostile_server}/good", 0))
    caplog.set_level(logging.INFO, logger="stabletrain_operator.observe.scrape")

    started = time.monotonic()
    results = asyncio.run(scrape_all(targets, timeout=1.0))
    elapsed = time.monotonic() - started

    by_pod = {r.pod: r for r in results}
    assert by_pod["good"].status is not None
    assert by_pod["good"].status.step == 12
    failed = [r for r in results if r.pod != "good"]
    assert all(r.status is None and r.error is not None for r in failed), [
        r for r in failed if r.error is None
    ]
    kinds = {r.error for r in failed}
    assert {ScrapeError.MALFORMED, ScrapeError.HTTP_STATUS, ScrapeError.TIMEOUT} <= kinds
    assert ScrapeError.WRONG_ATTEMPT in kinds
    assert ScrapeError.TOO_LARGE in kinds or by_pod["case-17"].error is ScrapeError.TIMEOUT
    logged = [r for r in caplog.records if "scrape of pod" in r.getMessage()]
    assert len(logged) == 100
    malformed = next(r for r in failed if r.error is ScrapeError.MALFORMED)
    assert "expected AgentStatus JSON" in malformed.detail
    assert elapsed < 5, f"all scrapes run at once, bounded by the timeout, took {elapsed:.1f} s"
    counts = sorted((k.value, sum(r.error is k for r in failed)) for k in kinds)
    print(f"100 hostile payloads -> errors {counts}; all scraped in {elapsed:.2f} s")
