"""Reading an agent's answer no further than a cap.

Every byte a pod sends is read into the shared operator's memory, so no answer is read
beyond what its kind can legitimately be (stabletrain_contract.channel: the status
body, a PUT's acknowledgement): an announced length over the cap is refused unread, and an
unannounced one is cut off as soon as it passes the cap.
"""

from __future__ import annotations

import aiohttp

CHUNK_BYTES = 16 * 1024


async def read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes | None:
    """The body, or None when it is (or announces to be) longer than `cap` bytes."""
    if response.content_length is not None and response.content_length > cap:
        return None
    body = bytearray()
    while chunk := await response.content.read(min(CHUNK_BYTES, cap + 1 - len(body))):
        body += chunk
        if len(body) > cap:
            return None
    return bytes(body)
