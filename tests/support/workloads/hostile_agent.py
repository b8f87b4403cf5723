"""An agent endpoint that serves what a hostile pod chooses, in a process of its own.

    python hostile_agent.py <directory> <port>

On 127.0.0.1:<port>, for any `<case>` prefix of the path:

- GET /<case>/v1/status answers `<directory>/<case>.json` with its Content-Length, or, for a
  case named `*-unsized`, without one, the end of the body being the end of the connection;
- PUT /<case>/v1/directives reads the request and answers the same file the same way.

A process of its own, so that what the test measures in its own memory is the operator's
side of the conversation only.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHUNK = 64 * 1024


class Handler(BaseHTTPRequestHandler):
    directory: Path

    def _answer(self) -> None:
        case = self.path.strip("/").split("/", 1)[0]
        body = (self.directory / f"{case}.json").read_bytes()
        sized = not case.endswith("-unsized")
        self.protocol_version = "HTTP/1.1" if sized else "HTTP/1.0"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if sized:
            self.send_header("Content-Length", str(len(body)))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        try:
            for start in range(0, len(body), CHUNK):
                self.wfile.write(body[start : start + CHUNK])
        except (BrokenPipeError, ConnectionResetError):
            return  # the client stopped reading: what a capped reader does

    def do_GET(self) -> None:
        self._answer()

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def log_message(self, format: str, *args: object) -> None:
        return


def main() -> None:
    directory, port = Path(sys.argv[1]), int(sys.argv[2])
    Handler.directory = directory
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"serving {directory} on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
