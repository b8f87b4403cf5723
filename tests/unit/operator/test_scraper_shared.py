"""The operator's one scrape session: its cap holds however many pods a round has, and the
same session serves round after round."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest

from stabletrain_agent.endpoint.http_server import REQUEST_TIMEOUT_SECONDS
from stabletrain_operator.observe.scrape import KEEPALIVE_SECONDS, Scraper, ScrapeTarget
from support.loopback_http import serving

ANSWER = json.dumps({
    "attempt": 0, "node": "node-a", "nodeRank": 0, "lrScale": 1.0, "appliedGeneration": 1,
    "updatedAt": datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
}).encode()  # fmt: skip


class _Answering(BaseHTTPRequestHandler):
    """Answers every GET with one valid agent status, quietly."""

    def answer(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, format: str, *args: object) -> None:
        return


class _Counting(_Answering):
    lock = threading.Lock()
    in_flight = 0
    most = 0

    def do_GET(self) -> None:
        with self.lock:
            _Counting.in_flight += 1
            _Counting.most = max(_Counting.most, _Counting.in_flight)
        time.sleep(0.1)
        with self.lock:
            _Counting.in_flight -= 1
        self.answer()


@pytest.fixture
def agent() -> Iterator[str]:
    with serving(_Counting) as url:
        yield url


def test_the_cap_bounds_requests_in_flight_across_rounds(agent: str) -> None:
    async def two_rounds() -> list[int]:
        scraper = Scraper(limit=3)
        try:
            targets = [ScrapeTarget(f"pod-{i}", agent, 0) for i in range(12)]
            rounds = await asyncio.gather(scraper.scrape_all(targets), scraper.scrape_all(targets))
        finally:
            await scraper.close()
        return [sum(r.status is not None for r in results) for results in rounds]

    assert asyncio.run(two_rounds()) == [12, 12]
    assert _Counting.most == 3, f"{_Counting.most} requests in flight at once, the cap is 3"


class _KeepAlive(_Answering):
    protocol_version = "HTTP/1.1"
    """As the agent's server (stabletrain_agent.endpoint.http_server): the connection stays open."""
    client_ports: ClassVar[list[int]] = []

    def do_GET(self) -> None:
        _KeepAlive.client_ports.append(self.client_address[1])
        self.answer()


def test_rounds_reuse_the_connection_to_an_agent() -> None:
    """Before: a new TCP connection per scrape (half the scrape CPU at 100 jobs). After:
    round after round over one connection while the agent keeps it open."""

    async def three_rounds(url: str) -> list[bool]:
        scraper = Scraper()
        try:
            target = ScrapeTarget("pod-0", url, 0)
            return [(await scraper.scrape_all([target]))[0].status is not None for _ in range(3)]
        finally:
            await scraper.close()

    with serving(_KeepAlive) as url:
        assert asyncio.run(three_rounds(url)) == [True, True, True]
    assert len(_KeepAlive.client_ports) == 3
    assert len(set(_KeepAlive.client_ports)) == 1, _KeepAlive.client_ports


def test_the_operator_drops_an_idle_connection_before_the_agent_does() -> None:
    """The agent closes a connection idle for its request timeout; reusing one it is closing
    would fail a scrape, so the operator's keep-alive ends first."""
    assert KEEPALIVE_SECONDS < REQUEST_TIMEOUT_SECONDS


def test_a_pod_not_scraped_again_soon_leaves_no_idle_connection() -> None:
    """Before: every scraped pod's connection stayed in the pool for KEEPALIVE_SECONDS, even
    when its next round came later and found it closed (at 1,000 jobs some 1,900 idle
    connections). After: such a scrape says `Connection: close`, and the pools hold nothing."""

    async def rounds(url: str) -> tuple[list[bool], int]:
        scraper = Scraper()
        try:
            target = ScrapeTarget("pod-0", url, 0, keep_alive=False)
            answered = [
                (await scraper.scrape_all([target]))[0].status is not None for _ in range(3)
            ]
            connectors = [scraper.session.connector, scraper._closing.connector]
            idle = sum(len(kept) for c in connectors if c is not None for kept in c._conns.values())
            return answered, idle
        finally:
            await scraper.close()

    _KeepAlive.client_ports.clear()
    with serving(_KeepAlive) as url:
        answered, idle = asyncio.run(rounds(url))
    assert answered == [True, True, True]
    assert idle == 0, f"{idle} idle connections kept"
    assert len(set(_KeepAlive.client_ports)) == 3, _KeepAlive.client_ports
