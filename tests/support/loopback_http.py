"""A real HTTP server on 127.0.0.1 in a thread, for tests of clients that scrape agents."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    """Many scrapes connect at once; the default backlog of 5 would delay most by a SYN
    retry and turn them into timeouts."""

    def handle_error(self, request: object, client_address: object) -> None:
        """Clients that gave up (timeouts) break the pipe; tests provoke that on purpose."""


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a free loopback port until the block ends; yields its base URL."""
    server = LoopbackServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
