"""The pod's agent port, served by the supervisor: the agent's routes passed through, the
supervisor's report added, and its orders.

The training agent serves on 127.0.0.1 behind it. GET /v1/status answers the agent's status
with a `supervisor` report added, or, when no agent answers (between attempts, after a
crash, a hang), the supervisor's own status (own_status.py), so a scrape always learns what
the pod's processes are doing. PUT /v1/directives goes through to the agent. The orders
(contract/supervisor.py) need the job's bearer token, as live directives do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from http import HTTPStatus
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from stabletrain_agent.supervisor.agent_link import AgentLink
from stabletrain_agent.supervisor.attempts import Attempts
from stabletrain_agent.supervisor.own_status import TierScan, own_status
from stabletrain_contract.base import ContractError
from stabletrain_contract.channel import (
    DIRECTIVES_HTTP_PATH,
    METRICS_HTTP_PATH,
    STATUS_HTTP_PATH,
    token_matches,
)
from stabletrain_contract.supervisor import (
    READY_HTTP_PATH,
    START_HTTP_PATH,
    STOP_HTTP_PATH,
    OrderAck,
    ProcessState,
    parse_start_order,
    parse_stop_order,
)

JSON = "application/json"
TEXT = "text/plain; version=0.0.4; charset=utf-8"
ORDER_MAX_BYTES = 1024 * 1024
"""An order carries one attempt's directives: the same bound as a live directive."""
Response = Iterator[bytes] | list[bytes]


class SupervisorMetrics:
    """The supervisor's own series, shown after the agent's (or alone without one)."""

    def __init__(self, attempts: Attempts) -> None:
        self.registry = CollectorRegistry()
        self._attempts = attempts
        self._counted = 0
        self.restarts = Counter(
            "stabletrain_supervisor_restarts",
            "Attempts started in this pod after its first (restarts in place).",
            registry=self.registry,
        )
        self.training_up = Gauge(
            "stabletrain_supervisor_training_up",
            "1 while the current attempt's processes run, else 0.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        report = self._attempts.report(agent_answered=False)
        restarts = max(report.attempts_started - 1, 0)
        self.restarts.inc(restarts - self._counted)
        self._counted = restarts
        self.training_up.set(1.0 if report.state is ProcessState.RUNNING else 0.0)
        return generate_latest(self.registry)


class Front:
    """Everything the WSGI application needs; one per supervisor."""

    def __init__(
        self,
        attempts: Attempts,
        agent: AgentLink,
        environ: Mapping[str, str],
        token: str,
        scan: TierScan,
    ) -> None:
        self.attempts = attempts
        self.agent = agent
        self.environ = environ
        self.token = token
        self.scan = scan
        self.metrics = SupervisorMetrics(attempts)

    def app(self) -> WSGIApplication:
        routes: dict[tuple[str, str], Callable[[WSGIEnvironment, StartResponse], Response]] = {
            ("GET", STATUS_HTTP_PATH): self._status,
            ("GET", METRICS_HTTP_PATH): self._metrics,
            ("GET", READY_HTTP_PATH): self._ready,
            ("PUT", DIRECTIVES_HTTP_PATH): self._directives,
            ("PUT", START_HTTP_PATH): self._start,
            ("PUT", STOP_HTTP_PATH): self._stop,
        }

        def application(environ: WSGIEnvironment, start_response: StartResponse) -> Response:
            route = routes.get((environ["REQUEST_METHOD"], environ["PATH_INFO"]))
            if route is None:
                known = ", ".join(f"{m} {p}" for m, p in routes)
                message = f"no route {environ['REQUEST_METHOD']} {environ['PATH_INFO']}; " + known
                return _json(start_response, HTTPStatus.NOT_FOUND, {"error": message})
            return route(environ, start_response)

        return application

    # ----------------------------------------------------------------- pass-through

    def _status(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        document = self.agent.status(environ.get("HTTP_AUTHORIZATION"))
        report = self.attempts.report(agent_answered=document is not None)
        if document is None or document.get("attempt") != report.attempt:
            document = own_status(
                self.environ, report.attempt, self.attempts.directives(), self.scan
            )
            report = report.model_copy(update={"agent_answered": False})
        document["supervisor"] = report.model_dump(mode="json", by_alias=True)
        return _json(start_response, HTTPStatus.OK, document)

    def _metrics(self, _: WSGIEnvironment, start_response: StartResponse) -> Response:
        answer = self.agent.metrics()
        body = (answer.body if answer is not None else b"") + self.metrics.render()
        start_response("200 OK", [("Content-Type", TEXT), ("Content-Length", str(len(body)))])
        return [body]

    def _directives(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        body = _read(environ)
        if isinstance(body, tuple):
            return _json(start_response, body[0], {"appliedGeneration": 0, "message": body[1]})
        answer = self.agent.put_directives(body, environ.get("HTTP_AUTHORIZATION"))
        if answer is None:
            message = "no training process answers in this pod now; retry"
            return _json(
                start_response,
                HTTPStatus.SERVICE_UNAVAILABLE,
                {"appliedGeneration": 0, "message": message},
            )
        status = HTTPStatus(answer.status)
        headers = [("Content-Type", answer.content_type or JSON)]
        headers.append(("Content-Length", str(len(answer.body))))
        start_response(f"{status.value} {status.phrase}", headers)
        return [answer.body]

    # ----------------------------------------------------------------- the supervisor's own

    def _ready(self, _: WSGIEnvironment, start_response: StartResponse) -> Response:
        report = self.attempts.report(agent_answered=False)
        status = HTTPStatus.OK if self.attempts.ready() else HTTPStatus.SERVICE_UNAVAILABLE
        return _json(start_response, status, {"attempt": report.attempt, "state": report.state})

    def _start(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        return self._order(environ, start_response, "start")

    def _stop(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        return self._order(environ, start_response, "stop")

    def _order(
        self, environ: WSGIEnvironment, start_response: StartResponse, kind: str
    ) -> Response:
        if not token_matches(environ.get("HTTP_AUTHORIZATION"), self.token):
            message = "expected header 'Authorization: Bearer <token>' with the job's token"
            return self._ack(start_response, HTTPStatus.UNAUTHORIZED, False, message)
        body = _read(environ)
        if isinstance(body, tuple):
            return self._ack(start_response, body[0], False, body[1])
        try:
            if kind == "start":
                accepted, message = self.attempts.order_start(parse_start_order(body))
            else:
                accepted, message = self.attempts.order_stop(parse_stop_order(body))
        except ContractError as error:
            return self._ack(start_response, HTTPStatus.BAD_REQUEST, False, str(error))
        status = HTTPStatus.OK if accepted else HTTPStatus.CONFLICT
        return self._ack(start_response, status, accepted, message)

    def _ack(
        self, start_response: StartResponse, status: HTTPStatus, accepted: bool, message: str
    ) -> Response:
        ack = OrderAck(
            accepted=accepted,
            message=message,
            report=self.attempts.report(agent_answered=False),
        )
        return _json(start_response, status, ack.model_dump(mode="json", by_alias=True))


def _json(start_response: StartResponse, status: HTTPStatus, document: object) -> Response:
    body = json.dumps(document).encode()
    start_response(
        f"{status.value} {status.phrase}",
        [("Content-Type", JSON), ("Content-Length", str(len(body)))],
    )
    return [body]


def _read(environ: WSGIEnvironment) -> bytes | tuple[HTTPStatus, str]:
    """A request body of at most ORDER_MAX_BYTES, or why it cannot be read."""
    raw = str(environ.get("CONTENT_LENGTH") or "")
    if not raw.strip().isdigit():
        return HTTPStatus.LENGTH_REQUIRED, "expected a Content-Length header with a byte count"
    length = int(raw)
    if length > ORDER_MAX_BYTES:
        return (
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"body of {length} bytes exceeds the {ORDER_MAX_BYTES}-byte limit",
        )
    body: bytes = environ["wsgi.input"].read(length)
    if len(body) != length:
        return HTTPStatus.BAD_REQUEST, f"body ended after {len(body)} of {length} announced bytes"
    return body
