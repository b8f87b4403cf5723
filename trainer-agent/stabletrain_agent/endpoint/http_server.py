"""A threaded WSGI server that keeps each connection for the next request, and ends the kept
ones when it stops.

prometheus_client's ThreadingWSGIServer (wsgiref underneath) answers one request per
connection. The operator scrapes every agent every second or few, and a new connection per
scrape was half of the operator's scrape CPU at 100 jobs, so each connection here serves
requests in HTTP/1.1 until the client ends it, or a request's body was left unread (the
next request would start inside it). An agent that stopped serving must not go on
answering over a kept connection either: the operator reads a silent agent as one whose
process is gone or frozen.

The server lives in the training process, so what a client can make it hold is bounded: at
most MAX_CONNECTIONS connections (a thread each) at once, each dropped after
REQUEST_TIMEOUT_SECONDS of silence; a connection beyond them gets a 503 and is closed by
the accepting thread, without a thread of its own.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any
from wsgiref.headers import Headers
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler
from wsgiref.types import WSGIApplication

from prometheus_client.exposition import ThreadingWSGIServer

_log = logging.getLogger(__name__)

HTTP_VERSION = "1.1"
REQUEST_TIMEOUT_SECONDS = 10.0
"""A client that stalls mid-request, or leaves its kept connection idle this long, loses
the connection instead of holding a thread."""
SHUTDOWN_POLL_SECONDS = 0.05
"""How often the serving thread checks for stop(): a stop returns within about this long."""
INTERNAL_ERROR_BODY = json.dumps({"error": "internal error; see the agent log"}).encode()
MAX_CONNECTIONS = 16
"""Open connections served at once. The operator keeps one per agent (one per replica
during a hand-over between replicas), a Prometheus server one or two."""
_BUSY_BODY = json.dumps({"error": "too many open connections to this agent; retry"}).encode()
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\n"
    + f"Content-Length: {len(_BUSY_BODY)}\r\n\r\n".encode()
    + _BUSY_BODY
)
REFUSAL_LOG_SECONDS = 60.0
"""At most one warning this often about refused connections (a flood must not fill the log)."""


class KeepAliveWSGIServer(ThreadingWSGIServer):
    """Serves one WSGI application on `address`, a thread per connection."""

    request_queue_size = 64
    """The listen backlog: socketserver's 5 made a burst of connections wait for SYN
    retransmits (seconds), the operator's among them; refusing one costs microseconds."""

    def __init__(self, address: tuple[str, int], application: WSGIApplication) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._refused = 0
        self._refusal_logged_at = -REFUSAL_LOG_SECONDS
        super().__init__(address, _Connection)
        self.set_app(application)

    def serve_in_background(self, thread_name: str) -> None:
        """Serve in a daemon thread until stop(); the bound port is known already."""
        self._thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
            name=thread_name,
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, end the kept connections and release the port."""
        if self._thread is not None:
            self.shutdown()
        self._end_open_connections()
        self.server_close()
        if self._thread is not None:
            self._thread.join()

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        with self._open_lock:
            self._open.add(connection)
        return connection, address

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection, unless MAX_CONNECTIONS are open already."""
        with self._open_lock:
            full = len(self._open) > MAX_CONNECTIONS  # this one is counted already
        if not full:
            super().process_request(request, client_address)
            return
        request.setblocking(False)  # the accepting thread must never wait on a client
        with contextlib.suppress(OSError):
            request.sendall(BUSY_RESPONSE)
        self.shutdown_request(request)
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= REFUSAL_LOG_SECONDS:
            self._refusal_logged_at = now
            _log.warning(
                "agent HTTP server: %d connection(s) refused so far, %d already open (last "
                "from %s)", self._refused, MAX_CONNECTIONS, client_address,
            )  # fmt: skip

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def _end_open_connections(self) -> None:
        with self._open_lock:
            connections, self._open = self._open, set()
        for connection in connections:
            with contextlib.suppress(OSError):  # the client may have gone already
                connection.shutdown(socket.SHUT_RDWR)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can stall on DNS; the name
        # is never used here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)
        self.setup_environ()

    def handle_error(self, request: Any, client_address: Any) -> None:
        _log.exception("agent HTTP server: error while serving %s", client_address)


class _Connection(WSGIRequestHandler):
    """The requests of one connection, one after another, while it can be kept."""

    server: KeepAliveWSGIServer
    timeout = REQUEST_TIMEOUT_SECONDS
    protocol_version = f"HTTP/{HTTP_VERSION}"
    wbufsize = -1
    """Buffered, so that a response leaves in one send: wsgiref writes the status line, each
    default header and the body separately, and flushes after the body. (http.server's two
    sends, headers then body, met the client's delayed ACK: 44 ms a request over a kept
    connection, against 0.1-0.3 ms now.)"""

    def handle(self) -> None:
        # wsgiref's handle() answers a single request; http.server's loops until closed.
        BaseHTTPRequestHandler.handle(self)

    def handle_expect_100(self) -> bool:
        """The interim 100 Continue goes out now: the client waits for it to send the body."""
        answered = super().handle_expect_100()
        self.wfile.flush()
        return answered

    def _run_application(self) -> None:
        environ = self.get_environ()
        body = _RequestBody(self.rfile, environ)
        run = _Run(body, self.wfile, self.get_stderr(), environ, multithread=True)
        run.request_handler = self
        application = self.server.get_app()
        assert application is not None, "set in KeepAliveWSGIServer.__init__"
        run.run(application)

    # The methods the application answers (refusing those it does not serve); any other
    # gets http.server's 501.
    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = _run_application  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("agent HTTP: " + format, *args)


class _Run(ServerHandler):
    """One request's run of the application: answered in HTTP/1.1, an error as JSON, and
    `Connection: close` whenever the connection cannot be kept."""

    http_version = HTTP_VERSION
    error_body = INTERNAL_ERROR_BODY
    request_handler: _Connection
    headers: Headers
    """Set by start_response (typeshed's stub leaves it out)."""

    def __init__(self, body: _RequestBody, *args: Any, **kwargs: Any) -> None:
        super().__init__(body, *args, **kwargs)
        self._body = body
        self.os_environ = {}  # not wsgiref's copy of the process's: it holds the token
        self.error_headers = [("Content-Type", "application/json")]

    def cleanup_headers(self) -> None:
        super().cleanup_headers()
        if not self._body.read_to_end:
            self.request_handler.close_connection = True
        if self.request_handler.close_connection:
            self.headers["Connection"] = "close"

    def handle_error(self) -> None:
        """No request, however malformed, may take the server (or training) down."""
        self.request_handler.close_connection = True
        super().handle_error()

    def log_exception(self, exc_info: Any) -> None:
        connection = self.request_handler
        _log.error(
            "agent HTTP server: %s %s failed",
            connection.command,
            connection.path,
            exc_info=exc_info,
        )


class _RequestBody:
    """wsgi.input that reads no further than the request's Content-Length, and knows whether
    the application read the body to its end: only then can the connection be kept."""

    def __init__(self, stream: io.BufferedIOBase, environ: Mapping[str, Any]) -> None:
        self._stream = stream
        declared = str(environ.get("CONTENT_LENGTH", ""))
        chunked = "chunked" in str(environ.get("HTTP_TRANSFER_ENCODING", ""))
        self._left: int | None
        """Bytes of the body not read yet; None when its end is unknown (never reached)."""
        if chunked or (declared and not declared.strip().isdigit()):
            self._left = None
        else:
            self._left = int(declared) if declared else 0

    @property
    def read_to_end(self) -> bool:
        return self._left == 0

    def _allowed(self, size: int) -> int:
        if self._left is None:
            return 0
        return self._left if size < 0 else min(size, self._left)

    def read(self, size: int = -1, /) -> bytes:
        data = self._stream.read(self._allowed(size))
        self._consumed(data)
        return data

    def readline(self, size: int = -1, /) -> bytes:
        data = self._stream.readline(self._allowed(size))
        self._consumed(data)
        return data

    def readlines(self, hint: int = -1, /) -> list[bytes]:
        lines = []
        total = 0
        while line := self.readline():
            lines.append(line)
            total += len(line)
            if 0 < hint <= total:
                break
        return lines

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def _consumed(self, data: bytes) -> None:
        if self._left is not None:
            self._left -= len(data)
