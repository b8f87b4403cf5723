"""The supervisor's requests to the training agent behind it (127.0.0.1 inside the pod).

Each call has a deadline well inside the operator's 2 s scrape timeout, so a hung training
process makes the supervisor answer with its own view instead of making the scrape fail.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any

from stabletrain_contract.channel import (
    AUTHORIZATION_HEADER,
    DIRECTIVES_HTTP_PATH,
    METRICS_HTTP_PATH,
    STATUS_HTTP_PATH,
)

DEADLINE_SECONDS = 1.0
BODY_MAX = 1024 * 1024
"""The agent's own answers are far smaller; more is not passed on."""


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes


class AgentLink:
    """Requests to the local agent; every failure is None, never an exception."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self._host = host
        self._port = port

    def _request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer | None:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=DEADLINE_SECONDS)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            data = response.read(BODY_MAX + 1)
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()
        if len(data) > BODY_MAX:
            return None
        return Answer(response.status, response.getheader("Content-Type") or "", data)

    def status(self, authorization: str | None) -> dict[str, Any] | None:
        """The agent's status document, or None when no agent answered with one. The
        caller's credential goes with it: only the operator's read completes a process's
        checkpoint hand-over."""
        headers = {AUTHORIZATION_HEADER: authorization} if authorization else {}
        answer = self._request("GET", STATUS_HTTP_PATH, headers=headers)
        if answer is None or answer.status != http.HTTPStatus.OK:
            return None
        try:
            document = json.loads(answer.body)
        except ValueError:
            return None
        return document if isinstance(document, dict) else None

    def metrics(self) -> Answer | None:
        """The agent's metrics in Prometheus' text format (asked for explicitly, so the
        supervisor's own series can follow them)."""
        answer = self._request("GET", METRICS_HTTP_PATH, headers={"Accept": "text/plain"})
        return answer if answer is not None and answer.status == http.HTTPStatus.OK else None

    def put_directives(self, body: bytes, authorization: str | None) -> Answer | None:
        headers = {"Content-Type": "application/json"}
        if authorization is not None:
            headers[AUTHORIZATION_HEADER] = authorization
        return self._request("PUT", DIRECTIVES_HTTP_PATH, body, headers)
