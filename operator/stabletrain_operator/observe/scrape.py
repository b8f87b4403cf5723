"""Concurrent scrapes of every worker pod's agent status endpoint.

A slow, unreachable or hostile endpoint must never stall the reconcile or crash the
operator: every request has a total deadline, bodies are read up to a size cap, and every
failure becomes a `ScrapeResult` with the kind of error (counted in the operator's metrics
and logged with what was expected) instead of an exception.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from http import HTTPStatus

import aiohttp

from stabletrain_contract.base import ContractError
from stabletrain_contract.channel import (
    AUTHORIZATION_HEADER,
    MAX_STATUS_BYTES,
    STATUS_HTTP_PATH,
    AgentStatus,
    bearer,
    parse_agent_status,
)
from stabletrain_contract.supervisor import SupervisorReport
from stabletrain_operator.pod_calls.capped_read import read_capped

_log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 2.0


class ScrapeError(StrEnum):
    """Why a scrape gave nothing usable; the label of the scrape-error counter."""

    UNREACHABLE = "Unreachable"
    TIMEOUT = "Timeout"
    HTTP_STATUS = "HttpStatus"
    TOO_LARGE = "TooLarge"
    MALFORMED = "Malformed"
    """Not the AgentStatus JSON: wrong types, missing fields, not JSON at all."""
    WRONG_ATTEMPT = "WrongAttempt"
    """An answer from another attempt's agent (an address reused by a new pod)."""
    NO_AGENT = "NoAgent"
    """The pod's supervisor answered, but no training agent behind it (between attempts,
    after a crash, or a hung process)."""


@dataclass(frozen=True)
class ScrapeTarget:
    pod: str
    url: str
    attempt: int
    credential: str = ""
    """The job's status credential (contract.channel.status_credential), sent so that the
    agent knows the read is the operator's: only such a read completes its checkpoint
    hand-over. Empty: sent without one."""
    keep_alive: bool = True
    """Keep the connection for the pod's next round. False when that round comes after
    KEEPALIVE_SECONDS, which would close the connection unused: the request then says
    `Connection: close` and the operator holds no idle connection per pod meanwhile."""


@dataclass(frozen=True)
class ScrapeResult:
    pod: str
    status: AgentStatus | None
    """The training agent's status; None when none answered (the error says why)."""
    error: ScrapeError | None = None
    detail: str = ""
    supervisor: SupervisorReport | None = None
    """The pod's supervisor's report, whether or not a training agent answered."""
    own: AgentStatus | None = None
    """The supervisor's own status while no training agent answers (its tier scan)."""


async def scrape_one(
    session: aiohttp.ClientSession, target: ScrapeTarget, timeout: float
) -> ScrapeResult:
    """One pod's status, or the reason there is none; never raises for a bad endpoint."""
    url = target.url + STATUS_HTTP_PATH
    headers = {AUTHORIZATION_HEADER: bearer(target.credential)} if target.credential else {}
    try:
        async with asyncio.timeout(timeout):
            async with session.get(url, headers=headers) as response:
                if response.status != HTTPStatus.OK:
                    return _failed(target, ScrapeError.HTTP_STATUS, f"HTTP {response.status}")
                body = await read_capped(response, MAX_STATUS_BYTES)
    except TimeoutError:
        return _failed(target, ScrapeError.TIMEOUT, f"no complete answer within {timeout} s")
    except (aiohttp.ClientError, OSError, ValueError) as error:
        return _failed(target, ScrapeError.UNREACHABLE, f"{type(error).__name__}: {error}")
    if body is None:
        return _failed(target, ScrapeError.TOO_LARGE, f"body over {MAX_STATUS_BYTES} bytes")
    try:
        status = parse_agent_status(body)
    except ContractError as error:
        return _failed(target, ScrapeError.MALFORMED, f"expected AgentStatus JSON; {error}")
    supervisor = status.supervisor
    if status.attempt != target.attempt:
        detail = f"answer is for attempt {status.attempt}, pod runs attempt {target.attempt}"
        failed = _failed(target, ScrapeError.WRONG_ATTEMPT, detail)
        return dataclasses.replace(failed, supervisor=supervisor)
    if supervisor is not None and not supervisor.agent_answered:
        silent = ScrapeResult(target.pod, None, ScrapeError.NO_AGENT, supervisor.state.value)
        return dataclasses.replace(silent, supervisor=supervisor, own=status)
    return ScrapeResult(target.pod, status, supervisor=supervisor)


def _failed(target: ScrapeTarget, error: ScrapeError, detail: str) -> ScrapeResult:
    _log.info("scrape of pod %s at %s failed (%s): %s", target.pod, target.url, error, detail[:500])
    return ScrapeResult(target.pod, None, error, detail)


MAX_CONCURRENT_SCRAPES = 256
"""Requests in flight across all jobs of one operator: a 256-node job's round waits for free
slots instead of opening 256 more sockets next to every other job's."""
KEEPALIVE_SECONDS = 8.0
"""How long an idle connection to an agent is kept for its next scrape. Below the agent's
own idle limit (stabletrain_agent.endpoint.http_server.REQUEST_TIMEOUT_SECONDS, 10 s), so
the operator never sends on a connection the agent is closing. A new connection per scrape
was half of the operator's scrape CPU at 100 jobs (bench/operator_scale.py, profiled).
Only pods scraped again within it keep theirs (ScrapeTarget.keep_alive): the 256 cap
counts requests in flight, not idle connections, and at 1,000 jobs, with rounds of 20 s,
the pool held some 1,900 connections that expired unused."""


class Scraper:
    """One HTTP session and one concurrency cap shared by every job's scrapes.

    Created inside the operator's event loop (kopf's startup handler) and closed at its
    cleanup; a session per round would open and tear down a connection pool per job per round.
    """

    def __init__(self, limit: int = MAX_CONCURRENT_SCRAPES) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=KEEPALIVE_SECONDS)
        )
        self._closing = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, force_close=True)
        )
        """For the targets that keep no connection (ScrapeTarget.keep_alive)."""

    async def scrape_all(
        self, targets: Sequence[ScrapeTarget], timeout: float = DEFAULT_TIMEOUT_SECONDS
    ) -> list[ScrapeResult]:
        """Every target as soon as a slot is free; each one's deadline starts when its own
        request does."""
        return list(await asyncio.gather(*(self._scrape(t, timeout) for t in targets)))

    async def _scrape(self, target: ScrapeTarget, timeout: float) -> ScrapeResult:
        session = self._session if target.keep_alive else self._closing
        async with self._slots:
            return await scrape_one(session, target, timeout)

    @property
    def session(self) -> aiohttp.ClientSession:
        """The session, for the live-directive PUTs (pod_calls/directive_put.py)."""
        return self._session

    async def close(self) -> None:
        await self._session.close()
        await self._closing.close()


async def scrape_all(
    targets: Sequence[ScrapeTarget], timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> list[ScrapeResult]:
    """Every target at once through a session of its own (callers without a Scraper)."""
    if not targets:
        return []
    scraper = Scraper()
    try:
        return await scraper.scrape_all(targets, timeout)
    finally:
        await scraper.close()
