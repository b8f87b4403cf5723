"""The operator's end of the live-directive PUT (stabletrain_contract.channel).

Async, on the operator's event loop like the scrapes, and through the scrapes' session when
there is one: a PUT then goes over the connection the agent's last scrape kept, and an
unreachable pod holds one coroutine for the timeout instead of a worker thread.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from stabletrain_contract.base import ContractError
from stabletrain_contract.channel import (
    AUTHORIZATION_HEADER,
    DIRECTIVES_HTTP_PATH,
    MAX_ACK_BYTES,
    DirectiveAck,
    bearer,
    parse_directive_ack,
)
from stabletrain_contract.directives import Directives
from stabletrain_operator.pod_calls.capped_read import read_capped


class AgentUnreachableError(ConnectionError):
    """The agent did not answer (pod gone, port closed, timeout); the next round retries."""


@dataclass(frozen=True)
class PutResult:
    status: int
    """The HTTP status; a refusal (401, 409, ...) still carries an acknowledgement."""
    ack: DirectiveAck


async def put_directives(
    session: aiohttp.ClientSession | None,
    base_url: str,
    directives: Directives,
    token: str,
    timeout: float,
) -> PutResult:
    """PUT live directives to one agent, within `timeout` seconds in all; without a
    `session`, through one of its own.

    Raises AgentUnreachableError when no answer came, ContractError when the answer is not
    a DirectiveAck (or is longer than any acknowledgement, MAX_ACK_BYTES: not read further).
    Delivery is idempotent by generation, so callers retry blindly.
    """
    if session is None:
        async with aiohttp.ClientSession() as own:
            return await put_directives(own, base_url, directives, token, timeout)
    url = base_url + DIRECTIVES_HTTP_PATH
    headers = {AUTHORIZATION_HEADER: bearer(token), "Content-Type": "application/json"}
    payload = directives.to_json().encode()
    try:
        async with asyncio.timeout(timeout):
            async with session.put(url, data=payload, headers=headers) as response:
                status, answer = response.status, await read_capped(response, MAX_ACK_BYTES)
    except TimeoutError:
        raise AgentUnreachableError(f"agent at {url} gave no answer within {timeout} s") from None
    except (aiohttp.ClientError, OSError, ValueError) as error:
        raise AgentUnreachableError(f"agent at {url} did not answer: {error}") from None
    if answer is None:
        raise ContractError(
            f"answer of the agent at {url} (HTTP {status}) is over {MAX_ACK_BYTES} bytes; "
            "expected a DirectiveAck, left unread"
        )
    return PutResult(status=status, ack=parse_directive_ack(answer))
