"""The operator's live-directive PUT against a real agent exporter on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.endpoint.exporter import AgentExporter
from stabletrain_agent.endpoint.http_server import KeepAliveWSGIServer
from stabletrain_contract.base import ContractError
from stabletrain_contract.channel import LiveOutcome, new_token
from stabletrain_contract.directives import Directives
from stabletrain_operator.observe.scrape import Scraper, ScrapeTarget
from stabletrain_operator.pod_calls.directive_put import (
    AgentUnreachableError,
    PutResult,
    put_directives,
)
from support.loopback_http import serving

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
    with AgentExporter(source=source, token=TOKEN, node="node-a", node_rank=0) as exporter:
        yield exporter


def _put(url: str, directives: Directives, token: str = TOKEN, timeout: float = 2.0) -> PutResult:
    return asyncio.run(put_directives(None, url, directives, token, timeout))


def test_a_put_applies_once_and_a_retry_is_acknowledged(
    exporter: AgentExporter, source: DirectiveSource
) -> None:
    applied = _put(exporter.url, _directives(2, lrScale=0.5))
    assert (applied.status, applied.ack.outcome, applied.ack.applied_generation) == (
        HTTPStatus.OK,
        LiveOutcome.APPLIED,
        2,
    )
    retried = _put(exporter.url, _directives(2, lrScale=0.5))
    assert (retried.status, retried.ack.outcome) == (HTTPStatus.OK, LiveOutcome.ALREADY_APPLIED)
    fenced = _put(exporter.url, _directives(3, attempt=ATTEMPT + 1))
    assert (fenced.status, fenced.ack.outcome) == (HTTPStatus.CONFLICT, LiveOutcome.WRONG_ATTEMPT)
    assert source.applied_generation == 2


def test_a_refused_put_still_returns_the_agents_acknowledgement(
    exporter: AgentExporter, source: DirectiveSource
) -> None:
    refused = _put(exporter.url, _directives(2), token="wrong")
    assert refused.status == HTTPStatus.UNAUTHORIZED
    assert refused.ack.outcome is None
    assert "Authorization: Bearer" in refused.ack.message
    assert source.applied_generation == 1


def test_the_put_shares_the_scrapes_kept_connection(
    exporter: AgentExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the Scraper's session, a PUT after a scrape opens no connection of its own."""
    accepted: list[Any] = []
    get_request = KeepAliveWSGIServer.get_request

    def counting(server: KeepAliveWSGIServer) -> tuple[socket.socket, Any]:
        connection, address = get_request(server)
        accepted.append(address)
        return connection, address

    monkeypatch.setattr(KeepAliveWSGIServer, "get_request", counting)

    async def scrape_then_put() -> PutResult:
        scraper = Scraper()
        try:
            (scraped,) = await scraper.scrape_all([ScrapeTarget("pod-0", exporter.url, ATTEMPT)])
            assert scraped.status is not None, scraped.detail
            return await put_directives(scraper.session, exporter.url, _directives(2), TOKEN, 2.0)
        finally:
            await scraper.close()

    assert asyncio.run(scrape_then_put()).ack.outcome is LiveOutcome.APPLIED
    assert len(accepted) == 1, accepted


def test_a_stopped_agent_is_reported_unreachable(source: DirectiveSource) -> None:
    exporter = AgentExporter(source=source, token=TOKEN, node="a", node_rank=0)
    with exporter:
        url, port = exporter.url, exporter.port
    with pytest.raises(AgentUnreachableError, match=str(port)):
        _put(url, _directives(2))


def test_an_agent_that_never_answers_is_unreachable_within_the_timeout() -> None:
    with socket.socket() as silent:  # accepts (the backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        with pytest.raises(AgentUnreachableError, match=r"within 0\.3 s"):
            _put(f"http://127.0.0.1:{silent.getsockname()[1]}", _directives(2), timeout=0.3)
        assert time.monotonic() - started < 2.0


class _NotAnAgent(BaseHTTPRequestHandler):
    def do_PUT(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "9")
        self.end_headers()
        self.wfile.write(b"not json!")

    def log_message(self, format: str, *args: object) -> None:
        return


def test_an_answer_that_is_no_acknowledgement_is_a_contract_error() -> None:
    with serving(_NotAnAgent) as url, pytest.raises(ContractError, match="acknowledgement"):
        _put(url, _directives(2))
