"""The operator's end of a supervisor's orders (stabletrain_contract.supervisor).

Like a live directive's PUT: async on the operator's loop, through the scrapes' session,
authenticated with the job's token, idempotent by attempt (so every tick may repeat one
whose effect its report does not show yet), and never raising for a pod that does not
answer. The answer carries the supervisor's report, which the tick keeps like a scraped one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

import aiohttp

from stabletrain_contract.base import ContractError
from stabletrain_contract.channel import AUTHORIZATION_HEADER, bearer
from stabletrain_contract.supervisor import (
    START_HTTP_PATH,
    STOP_HTTP_PATH,
    StartOrder,
    StopOrder,
    SupervisorReport,
    parse_order_ack,
)

_log = logging.getLogger(__name__)

Order = StartOrder | StopOrder


async def send_order(
    session: aiohttp.ClientSession,
    pod: str,
    base_url: str,
    order: Order,
    *,
    token: str,
    timeout: float,
) -> SupervisorReport | None:
    """One order to one pod's supervisor; its report after taking the order, or None (logged)
    when it did not answer or refused (a refusal names the reason)."""
    path = START_HTTP_PATH if isinstance(order, StartOrder) else STOP_HTTP_PATH
    url = base_url + path
    headers = {AUTHORIZATION_HEADER: bearer(token), "Content-Type": "application/json"}
    try:
        async with asyncio.timeout(timeout):
            async with session.put(url, data=order.model_dump_json(), headers=headers) as answer:
                status, body = answer.status, await answer.read()
        ack = parse_order_ack(body)
    except TimeoutError:
        _log.warning("order to %s at %s: no answer within %.0f s (sent again next tick)", pod,
                     url, timeout)  # fmt: skip
        return None
    except (aiohttp.ClientError, OSError, ValueError, ContractError) as error:
        _log.warning("order to %s at %s failed (sent again next tick): %s", pod, url, error)
        return None
    if not ack.accepted:
        _log.warning("order to %s refused (HTTP %d): %s", pod, status, ack.message)
    return ack.report


async def send_orders(
    session: aiohttp.ClientSession | None,
    orders: Iterable[tuple[str, str, Order]],
    token: str,
    timeout: float,
) -> Mapping[str, SupervisorReport]:
    """(pod, base URL, order) all at once; the reports of those that answered, by pod."""
    todo = list(orders)
    if not todo:
        return {}
    if session is None:
        async with aiohttp.ClientSession() as own:
            return await send_orders(own, todo, token, timeout)
    reports = await asyncio.gather(
        *(
            send_order(session, pod, url, order, token=token, timeout=timeout)
            for pod, url, order in todo
        )
    )
    return {pod: report for (pod, _, _), report in zip(todo, reports, strict=True) if report}
