"""Readiness probes (httpGet), as the kubelet's prober runs them against a running container.

A thread per probed container GETs `http://<pod IP>:<port><path>` every `periodSeconds`
(after `initialDelaySeconds`), with `timeoutSeconds`; a 2xx or 3xx answer is a success. The
container turns ready after `successThreshold` successes in a row and not ready after
`failureThreshold` failures in a row, and is not ready until its first success, as with a
kubelet. Only httpGet is supported (what the project's pods use); any other handler is
refused with a message, never ignored.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass

from support.localnode.api import Json
from support.localnode.sources import PodConfigError


def _port(container: Json, port: object) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise PodConfigError(f"readinessProbe port {port!r} names no port of the container")


@dataclass(frozen=True)
class ProbeSettings:
    port: int
    path: str
    delay: float
    period: float
    timeout: float
    successes_needed: int
    failures_needed: int


def readiness_settings(container: Json) -> ProbeSettings | None:
    """The container's readiness probe (None: it has none); PodConfigError for what the
    local node cannot run."""
    probe: Json | None = container.get("readinessProbe")
    if not probe:
        return None
    if set(probe) & {"exec", "tcpSocket", "grpc"} or "httpGet" not in probe:
        raise PodConfigError("the local node runs httpGet readiness probes only")
    get = probe["httpGet"]
    return ProbeSettings(
        port=_port(container, get.get("port")),
        path=str(get.get("path") or "/"),
        delay=float(probe.get("initialDelaySeconds") or 0),
        period=float(probe.get("periodSeconds") or 10),
        timeout=float(probe.get("timeoutSeconds") or 1),
        successes_needed=int(probe.get("successThreshold") or 1),
        failures_needed=int(probe.get("failureThreshold") or 3),
    )


class ReadinessProber:
    """Probes one container until stopped; `changed` is called whenever readiness flips."""

    def __init__(self, settings: ProbeSettings, pod_ip: str, changed: Callable[[], None]) -> None:
        self._settings = settings
        self._host = pod_ip
        self._changed = changed
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ready = False
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        with self._lock:
            return self._ready

    def stop(self) -> None:
        self._stop.set()

    def _probe(self) -> bool:
        settings = self._settings
        connection = http.client.HTTPConnection(self._host, settings.port, timeout=settings.timeout)
        try:
            connection.request("GET", settings.path)
            return 200 <= connection.getresponse().status < 400
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()

    def _run(self) -> None:
        settings = self._settings
        successes = failures = 0
        if self._stop.wait(settings.delay):
            return
        while not self._stop.is_set():
            if self._probe():
                successes, failures = successes + 1, 0
            else:
                successes, failures = 0, failures + 1
            with self._lock:
                before = self._ready
                if successes >= settings.successes_needed:
                    self._ready = True
                elif failures >= settings.failures_needed:
                    self._ready = False
                flipped = before != self._ready
            if flipped:
                self._changed()
            self._stop.wait(settings.period)
