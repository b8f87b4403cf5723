"""More requests at once than the API connection pool keeps: the extra connections are
closed after use without a warning per connection (at 1,000 jobs they came in bursts of
hundreds), while urllib3's other warnings still reach the log."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import kopf
import pytest

from stabletrain_operator import apiserver
from stabletrain_operator.apiserver import ApiServer
from stabletrain_operator.kube import PODS
from support.loopback_http import serving

AT_ONCE = 4


def _held_until_all_arrive(arrived: threading.Barrier) -> type[BaseHTTPRequestHandler]:
    class Held(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: each connection goes back to the pool

        def do_GET(self) -> None:
            arrived.wait(timeout=10)
            data = json.dumps({"items": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Held


@pytest.fixture
def url() -> Iterator[str]:
    with serving(_held_until_all_arrive(threading.Barrier(AT_ONCE))) as base:
        yield base


def _lists_at_once(url: str) -> None:
    api = ApiServer(lambda: kopf.ConnectionInfo(server=url, token="t"))
    answers: list[object] = []
    threads = [
        threading.Thread(target=lambda: answers.append(api.call("list", PODS, namespace="ml")))
        for _ in range(AT_ONCE)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    api.close()
    assert answers == [{"items": []}] * AT_ONCE


def test_connections_beyond_the_pool_close_quietly(
    url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(apiserver, "CONNECTION_POOL", 2)
    pool_log = logging.getLogger("urllib3.connectionpool")
    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    _lists_at_once(url)
    overflow = [r for r in caplog.records if "pool is full" in r.getMessage()]
    assert len(overflow) == AT_ONCE - 2  # unfiltered: one warning per connection closed
    caplog.clear()
    apiserver.quiet_pool_overflow()
    try:
        _lists_at_once(url)
        pool_log.warning("Retrying after connection broken")
    finally:
        pool_log.removeFilter(apiserver._not_pool_overflow)
    assert [r.getMessage() for r in caplog.records] == ["Retrying after connection broken"]
