"""What the agent's HTTP server answers, as one WSGI application.

/metrics is prometheus_client's own application over the exporter's registry (it
negotiates the exposition format and compression with the scraper); beside it, the JSON
status and the live-directive PUT. Every refusal says what was expected: PUTs to the
directive path get a DirectiveAck (the operator logs its message), the rest
``{"error": ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import TYPE_CHECKING
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import make_wsgi_app

from stabletrain_contract.channel import (
    DIRECTIVES_HTTP_PATH,
    MAX_DIRECTIVES_BYTES,
    METRICS_HTTP_PATH,
    STATUS_HTTP_PATH,
    DirectiveAck,
)

if TYPE_CHECKING:
    from stabletrain_agent.endpoint.exporter import AgentExporter

JSON = "application/json"
Response = Iterator[bytes] | list[bytes]
Route = Callable[[WSGIEnvironment, StartResponse], Response]
Refusal = tuple[HTTPStatus, str, str]
"""A PUT refused before it was judged: HTTP status, the outcome counted, the message."""


def agent_app(exporter: AgentExporter) -> WSGIApplication:
    """The application the exporter serves: each method's paths, the rest refused."""
    routes: dict[str, dict[str, Route]] = {
        "GET": {
            METRICS_HTTP_PATH: make_wsgi_app(exporter.registry),
            STATUS_HTTP_PATH: lambda environ, start: _status(exporter, environ, start),
        },
        "PUT": {
            DIRECTIVES_HTTP_PATH: lambda environ, start: _put_directives(exporter, environ, start),
        },
    }

    def application(environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        method, path = environ["REQUEST_METHOD"], environ["PATH_INFO"]
        paths = routes.get(method)
        if paths is None:
            message = f"method {method} not allowed; expected {' or '.join(routes)}"
            allow = [("Allow", ", ".join(routes))]
            return _error(start_response, HTTPStatus.METHOD_NOT_ALLOWED, message, allow)
        route = paths.get(path)
        if route is None:
            message = f"no such path {path!r}; expected {' or '.join(paths)}"
            return _error(start_response, HTTPStatus.NOT_FOUND, message)
        return route(environ, start_response)

    return application


def _status(
    exporter: AgentExporter, environ: WSGIEnvironment, start_response: StartResponse
) -> Response:
    operator = exporter.operator_reading(environ.get("HTTP_AUTHORIZATION"))
    if operator:  # anyone may read; only the operator's read rescans a disk and hands over
        exporter.refresh_status()
    serial = exporter.inventory_serial  # read first: the status shows this or newer
    body = exporter.status().model_dump_json().encode()
    _start(start_response, HTTPStatus.OK, body)
    if not operator:
        return [body]
    return _then(body, lambda: exporter.inventory_sent(serial))


def _then(body: bytes, sent: Callable[[], None]) -> Iterator[bytes]:
    """The body, then `sent()` once the server has written it (not when writing failed):
    the guard's hand-over waits for a status that reached the operator."""
    yield body
    sent()


def _put_directives(
    exporter: AgentExporter, environ: WSGIEnvironment, start_response: StartResponse
) -> Response:
    if not exporter.authorized(environ.get("HTTP_AUTHORIZATION")):
        refused = exporter.refuse(
            HTTPStatus.UNAUTHORIZED,
            "Unauthorized",
            "expected header 'Authorization: Bearer <token>' with the job's token",
        )
        return _ack(start_response, *refused)  # the body is never read
    body = _read_body(environ)
    if isinstance(body, tuple):
        return _ack(start_response, *exporter.refuse(*body))
    return _ack(start_response, *exporter.receive_directives(body))


def _read_body(environ: WSGIEnvironment) -> bytes | Refusal:
    """The request body, or why it cannot be read (a body too large is never read)."""
    raw = environ.get("CONTENT_LENGTH", "")
    if not raw or "chunked" in environ.get("HTTP_TRANSFER_ENCODING", ""):
        return HTTPStatus.LENGTH_REQUIRED, "LengthRequired", "expected a Content-Length header"
    if not raw.strip().isdigit():
        return (
            HTTPStatus.BAD_REQUEST,
            "BadRequest",
            f"Content-Length must be a byte count, got {raw!r}",
        )
    length = int(raw)
    if length > MAX_DIRECTIVES_BYTES:
        return (
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            "TooLarge",
            f"body of {length} bytes exceeds the {MAX_DIRECTIVES_BYTES}-byte limit",
        )
    body: bytes = environ["wsgi.input"].read(length)
    if len(body) != length:
        return (
            HTTPStatus.BAD_REQUEST,
            "BadRequest",
            f"body ended after {len(body)} of {length} announced bytes",
        )
    return body


def _ack(start_response: StartResponse, status: HTTPStatus, ack: DirectiveAck) -> Response:
    extra = [("WWW-Authenticate", "Bearer")] if status == HTTPStatus.UNAUTHORIZED else []
    body = ack.model_dump_json().encode()
    _start(start_response, status, body, extra)
    return [body]


def _error(
    start_response: StartResponse,
    status: HTTPStatus,
    message: str,
    extra_headers: list[tuple[str, str]] | None = None,
) -> Response:
    body = json.dumps({"error": message}).encode()
    _start(start_response, status, body, extra_headers)
    return [body]


def _start(
    start_response: StartResponse,
    status: HTTPStatus,
    body: bytes,
    extra_headers: list[tuple[str, str]] | None = None,
) -> None:
    headers = [("Content-Type", JSON), ("Content-Length", str(len(body)))]
    start_response(f"{status.value} {status.phrase}", headers + (extra_headers or []))
