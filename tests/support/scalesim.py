"""Thousands of worker pods without a training process: a simulated kubelet and fake agents.

For the operator's scale benchmark (bench/operator_scale.py). The kubelet watches one
namespace's worker pods on the real control plane and does what a node would: it binds each
new pod to one of a few simulated Nodes (kept Ready by a renewed Lease, localnode/node.py),
gives it an address on loopback (127.20.0.0/16, never anything else), marks it Running, and
when the operator deletes it confirms the deletion as a kubelet does (grace 0). Every Running
pod's agent status endpoint is answered by one asyncio server per pod address in this one
process: the answer is a valid AgentStatus of the pod's attempt, node and rank whose step
and heartbeat advance with the clock, so the operator sees healthy, progressing training.

``trip`` makes one pod end as the agent does on a trip: Failed, its container terminated
with the TripReport JSON as termination message, its status endpoint gone. A pod the
operator put under the supervisor (recovery.restart InPlace) is simulated with one: a trip
ends only its "processes" (the pod stays Running and turns not Ready, the status endpoint
answers the supervisor's report with the trip's message), and the supervisor's stop and
start orders move it to the next attempt in place, as stabletrain_agent.supervisor does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, watch

from stabletrain_agent.endpoint.http_server import REQUEST_TIMEOUT_SECONDS
from stabletrain_contract.channel import (
    DIRECTIVES_HTTP_PATH,
    OUTCOME_STATUS,
    STATUS_HTTP_PATH,
    AgentStatus,
    DirectiveAck,
    Heartbeat,
    LiveOutcome,
    ThreadPlace,
    judge_live_directive,
)
from stabletrain_contract.directives import Directives, parse_directives
from stabletrain_contract.names import AnomalyClass
from stabletrain_contract.supervisor import (
    START_HTTP_PATH,
    STOP_HTTP_PATH,
    OrderAck,
    ProcessState,
    SupervisorReport,
    parse_start_order,
    parse_stop_order,
)
from stabletrain_contract.trip_report import TripReport
from stabletrain_operator import naming
from support.localnode.api import ApiError, Json, RawApi, pod_path
from support.localnode.container import Exit
from support.localnode.node import NodeAgent, now
from support.localnode.status import ContainerView, pod_status

log = logging.getLogger(__name__)

POD_NETWORK = ipaddress.ip_network("127.20.0.0/16")
"""Pod addresses: loopback only (the whole 127.0.0.0/8 reaches this host)."""
STEPS_PER_SECOND = 2.0
"""How fast the fake agents' training advances."""
KUBELET_THREADS = 32
"""Pod API calls the simulated kubelet makes at once (binds, status, grace-0 deletes)."""


@dataclass
class SimulatedPod:
    name: str
    attempt: int
    rank: int
    node: str
    ip: str
    port: int
    started: datetime
    directives: Directives
    """What the pod runs with: its start order's, then the newest live directive it took.
    Its own directives file is not read here: it starts with its attempt's generation 1
    (what a fresh job's pods hold; a recreated pod of a later attempt would refuse a live
    directive's resume step, so only in-place attempts take every one)."""
    server: asyncio.Server | None = None
    connections: set[asyncio.StreamWriter] = field(default_factory=set)
    """Open keep-alive connections: closing the server alone would leave them answering."""
    supervised: bool = False
    process: ProcessState = ProcessState.RUNNING
    """The state of the simulated training processes of a supervised pod."""
    message: str = ""
    """What the ended attempt left (a trip report)."""
    ended: datetime | None = None
    starts: int = 1
    started_at: float = 0.0
    """time.monotonic() when the current attempt's processes started."""

    def report(self, *, answered: bool) -> SupervisorReport:
        ended = self.process is not ProcessState.RUNNING
        return SupervisorReport(
            attempt=self.attempt,
            state=self.process,
            started_at=self.started,
            ended_at=self.ended if ended else None,
            exit_code=(1 if self.process is ProcessState.EXITED else 143) if ended else None,
            message=self.message if ended else "",
            attempts_started=self.starts,
            agent_answered=answered,
        )


@dataclass
class Counts:
    """What the simulator did, for the benchmark's sanity lines."""

    bound: int = 0
    running: int = 0
    deleted: int = 0
    answered: int = 0
    errors: list[str] = field(default_factory=list)


def agent_status(pod: SimulatedPod, at: datetime) -> bytes:
    """A healthy pod's status: step and heartbeat move with the clock; under a supervisor,
    its report added, and only the supervisor's own while the processes are down."""
    if pod.supervised and pod.process is not ProcessState.RUNNING:
        own = AgentStatus(
            attempt=pod.attempt,
            node=pod.node,
            node_rank=pod.rank,
            updated_at=at,
            lr_scale=1.0,
            applied_generation=pod.directives.generation,
            supervisor=pod.report(answered=False),
        )
        return own.model_dump_json().encode()
    step = int((at - pod.started).total_seconds() * STEPS_PER_SECOND)
    beat = Heartbeat(
        rank=pod.rank,
        started_at=pod.started,
        steps_completed=step,
        last_step=step if step else None,
        last_step_at=at if step else None,
        slowest_step_seconds=1.0 / STEPS_PER_SECOND,
        in_step=True,
        place=ThreadPlace.ELSEWHERE,
    )
    status = AgentStatus(
        attempt=pod.attempt,
        node=pod.node,
        node_rank=pod.rank,
        updated_at=at,
        step=step,
        loss=2.0,
        loss_baseline=2.0,
        grad_norm=0.5,
        grad_norm_baseline=0.5,
        lr_scale=1.0,
        tokens_per_second=1000.0,
        applied_generation=pod.directives.generation,
        heartbeat=beat,
        supervisor=pod.report(answered=True) if pod.supervised else None,
    )
    return status.model_dump_json().encode()


def live_directive(pod: SimulatedPod, body: bytes) -> tuple[str, bytes]:
    """The agent's answer to a live directive (the HTTP status line and the DirectiveAck),
    judged by the contract's own rule."""
    incoming = parse_directives(body)
    outcome = judge_live_directive(pod.directives, incoming)
    if outcome is LiveOutcome.APPLIED:
        pod.directives = incoming
    status = OUTCOME_STATUS[outcome]
    ack = DirectiveAck(outcome=outcome, applied_generation=pod.directives.generation)
    return f"{status.value} {status.phrase}", ack.model_dump_json().encode()


def trip_message(pod: SimulatedPod, at: datetime) -> str:
    step = int((at - pod.started).total_seconds() * STEPS_PER_SECOND)
    report = TripReport(
        attempt=pod.attempt,
        node=pod.node,
        step=step,
        tripped_at=at,
        signal="LossSpike",
        anomaly_class=AnomalyClass.BAD_BATCH,
        evidence="injected by the scale benchmark",
        value=9.0,
        threshold=4.0,
        onset_step=max(0, step - 2),
        last_good_step=max(0, step - 3),
    )
    return report.model_dump_json()


class ScaleSimulator:
    """The kubelet and the agents of one namespace, on an asyncio loop of their own thread."""

    def __init__(self, api_client: client.ApiClient, namespace: str, nodes: int = 4) -> None:
        self.api_client = api_client
        self.raw = RawApi(api_client)
        self.namespace = namespace
        self.counts = Counts()
        self.nodes = [NodeAgent(self.raw, f"scale-node-{i}", "127.0.0.1", {}) for i in range(nodes)]
        self.pods: dict[str, SimulatedPod] = {}
        self._addresses = itertools.islice(POD_NETWORK.hosts(), 1, None)
        self._next_node = itertools.cycle(n.name for n in self.nodes)
        self._loop = asyncio.new_event_loop()
        # Each real node's kubelet works on its own pods: 256 deletions or starts must not
        # queue behind the default executor's few threads.
        self._loop.set_default_executor(ThreadPoolExecutor(max_workers=KUBELET_THREADS))
        self._thread = threading.Thread(target=self._loop.run_forever, name="scalesim", daemon=True)
        self._watcher = threading.Thread(target=self._watch, name="scalesim-watch", daemon=True)
        self._stopping = threading.Event()
        self._watch_handle: watch.Watch | None = None
        self.last_trip_message = ""
        """The termination message of the newest trip (its size is part of the benchmark)."""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for node in self.nodes:
            node.register()
        self._thread.start()
        self._watcher.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._watch_handle is not None:
            self._watch_handle.stop()  # type: ignore[no-untyped-call]
        future = asyncio.run_coroutine_threadsafe(self._close_all(), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._watcher.join(timeout=10)
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.deregister()

    async def _close_all(self) -> None:
        for pod in list(self.pods.values()):
            await self._close(pod)

    # ------------------------------------------------------------------ kubelet

    def _watch(self) -> None:
        core: Any = client.CoreV1Api(self.api_client)
        while not self._stopping.is_set():
            self._watch_handle = watch.Watch()  # type: ignore[no-untyped-call]
            try:
                for event in self._watch_handle.stream(  # type: ignore[no-untyped-call]
                    core.list_namespaced_pod, self.namespace, timeout_seconds=60,
                    label_selector=naming.JOB_LABEL,
                ):  # fmt: skip
                    pod = self.api_client.sanitize_for_serialization(event["object"])  # type: ignore[no-untyped-call]
                    asyncio.run_coroutine_threadsafe(self._on_pod(event["type"], pod), self._loop)
            except Exception as error:  # a watch that breaks is started again
                if not self._stopping.is_set():
                    log.warning("pod watch ended: %s", error)

    async def _on_pod(self, kind: str, pod: Json) -> None:
        try:
            await self._handle(kind, pod)
        except Exception as error:  # one pod's trouble must not stop the others
            self.counts.errors.append(f"{pod['metadata']['name']}: {error}")
            log.warning("simulated kubelet: pod %s: %s", pod["metadata"]["name"], error)

    async def _handle(self, kind: str, pod: Json) -> None:
        metadata, spec = pod["metadata"], pod["spec"]
        status = pod.get("status") or {}
        name = metadata["name"]
        if kind == "DELETED":
            if name in self.pods:
                await self._close(self.pods.pop(name))
            return
        if metadata.get("deletionTimestamp"):
            if name in self.pods:
                await self._close(self.pods.pop(name))
            body = {"gracePeriodSeconds": 0}
            if await asyncio.to_thread(self.raw.delete, pod_path(self.namespace, name), body):
                self.counts.deleted += 1
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        if not spec.get("nodeName"):
            await asyncio.to_thread(self._bind, metadata, next(self._next_node))
            return
        if name not in self.pods and not status.get("podIP"):
            await self._run(pod)

    def _bind(self, metadata: Json, node: str) -> None:
        binding = {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": metadata["name"], "uid": metadata["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }  # fmt: skip
        try:
            self.raw.post(pod_path(self.namespace, metadata["name"]) + "/binding", binding)
            self.counts.bound += 1
        except ApiError as error:
            if error.status != 409:  # bound already (a repeated event)
                raise

    async def _run(self, pod: Json) -> None:
        metadata, spec = pod["metadata"], pod["spec"]
        labels = metadata.get("labels") or {}
        port = _agent_port(spec)
        attempt = int(labels[naming.ATTEMPT_LABEL])
        simulated = SimulatedPod(
            name=metadata["name"],
            attempt=attempt,
            rank=int(labels[naming.RANK_LABEL]),
            node=spec["nodeName"],
            ip=str(next(self._addresses)),
            port=port,
            started=datetime.now(UTC),
            directives=Directives(generation=1, attempt=attempt),
            supervised=labels.get(naming.RESTART_LABEL) == naming.IN_PLACE,
            started_at=time.monotonic(),
        )
        self.pods[simulated.name] = simulated
        simulated.server = await asyncio.start_server(
            lambda r, w: self._answer(simulated, r, w), simulated.ip, port
        )
        started = now()
        view = ContainerView(
            name=spec["containers"][0]["name"], image="local", running_since=started,
            container_id=f"scalesim://{simulated.name}", runs=1,
        )  # fmt: skip
        body = {"status": pod_status([view], simulated.ip, "127.0.0.1", started, started, since={})}
        await asyncio.to_thread(self._patch_status, simulated.name, body)
        self.counts.running += 1

    def _patch_status(self, name: str, body: Json) -> None:
        self.raw.request(
            "PATCH", pod_path(self.namespace, name) + "/status", body,
            content_type="application/strategic-merge-patch+json",
        )  # fmt: skip

    async def _close(self, pod: SimulatedPod) -> None:
        if pod.server is not None:
            pod.server.close()
            pod.server = None
        for writer in pod.connections:
            writer.close()
        pod.connections.clear()

    # ------------------------------------------------------------------ agents

    async def _answer(
        self, pod: SimulatedPod, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Requests on one connection until the client closes it or leaves it idle for the
        agent's own limit (HTTP/1.1 keep-alive, as stabletrain_agent.endpoint.http_server
        serves)."""
        pod.connections.add(writer)
        try:
            while True:
                request = await asyncio.wait_for(
                    reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_SECONDS
                )
                path = request.split(b" ", 2)[1].decode() if request.count(b" ") >= 2 else ""
                sent = await reader.readexactly(_content_length(request))
                if request.startswith(b"GET ") and path == STATUS_HTTP_PATH:
                    body, code = agent_status(pod, datetime.now(UTC)), "200 OK"
                    self.counts.answered += 1
                elif request.startswith(b"PUT ") and path in (START_HTTP_PATH, STOP_HTTP_PATH):
                    body, code = await self._order(pod, path, sent), "200 OK"
                elif request.startswith(b"PUT ") and path == DIRECTIVES_HTTP_PATH:
                    code, body = live_directive(pod, sent)
                else:
                    body, code = b'{"error": "not simulated"}', "404 Not Found"
                head = (
                    f"HTTP/1.1 {code}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                )
                writer.write(head.encode() + body)
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            pod.connections.discard(writer)
            writer.close()

    async def _order(self, pod: SimulatedPod, path: str, body: bytes) -> bytes:
        """A supervisor's order, carried out at once (the processes stop and start in no
        time here: what is measured is the operator's side)."""
        if path == STOP_HTTP_PATH:
            parse_stop_order(body)
            if pod.process is ProcessState.RUNNING:
                pod.process, pod.ended = ProcessState.STOPPED, datetime.now(UTC)
        else:
            order = parse_start_order(body)
            if order.directives.attempt > pod.attempt or pod.process is not ProcessState.RUNNING:
                pod.attempt = order.directives.attempt
                pod.process, pod.message, pod.ended = ProcessState.RUNNING, "", None
                pod.started, pod.started_at = datetime.now(UTC), time.monotonic()
                pod.starts += 1
                pod.directives = order.directives
                await asyncio.to_thread(self._patch_status, pod.name, _ready_status(pod, True))
        ack = OrderAck(accepted=True, report=pod.report(answered=False))
        return ack.model_dump_json().encode()

    # ------------------------------------------------------------------ trips

    def trip(self, *pod_names: str) -> None:
        """End running pods as tripped agents do, all at once as the kubelets of ranks that
        trip at the same step would (called from any thread); returns when every pod's
        Failed status is stored."""
        future = asyncio.run_coroutine_threadsafe(self._trip_all(pod_names), self._loop)
        future.result(timeout=30)

    async def _trip_all(self, pod_names: tuple[str, ...]) -> None:
        await asyncio.gather(*(self._trip(name) for name in pod_names))

    async def _trip(self, pod_name: str) -> None:
        pod = self.pods[pod_name]
        at = datetime.now(UTC)
        if pod.supervised:  # the processes end, the pod stays: its readiness says so
            self.last_trip_message = trip_message(pod, at)
            pod.process, pod.message, pod.ended = ProcessState.EXITED, self.last_trip_message, at
            await asyncio.to_thread(self._patch_status, pod.name, _ready_status(pod, False))
            return
        self.last_trip_message = trip_message(pod, at)
        await self._end(pod_name, 1, "Error", self.last_trip_message)

    def finish(self, *pod_names: str) -> None:
        """End running pods as training that completed does, supervised or not: the container
        exits 0 and the pod is Succeeded (called from any thread)."""
        future = asyncio.run_coroutine_threadsafe(self._finish_all(pod_names), self._loop)
        future.result(timeout=120)

    async def _finish_all(self, pod_names: tuple[str, ...]) -> None:
        await asyncio.gather(*(self._end(name, 0, "Completed", "") for name in pod_names))

    async def _end(self, pod_name: str, code: int, reason: str, message: str) -> None:
        """The pod's container exited with `code`: the pod is done."""
        pod = self.pods.pop(pod_name)
        await self._close(pod)
        started = pod.started.strftime("%Y-%m-%dT%H:%M:%SZ")
        ended = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        view = ContainerView(
            name="trainer", image="local", container_id=f"scalesim://{pod.name}", runs=1,
            exits=[Exit(code, reason, message, started, ended)],
        )  # fmt: skip
        body = {"status": pod_status([view], pod.ip, "127.0.0.1", started, ended, since={})}
        await asyncio.to_thread(self._patch_status, pod.name, body)

    def running_pods(self) -> Iterator[SimulatedPod]:
        return iter(list(self.pods.values()))


def _agent_port(spec: Json) -> int:
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == naming.AGENT_PORT_NAME:
                return int(port["containerPort"])
    raise ValueError("the pod declares no st-agent container port")


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def _ready_status(pod: SimulatedPod, ready: bool) -> Json:
    """A running pod's status with its readiness (the supervisor's probe, as a kubelet
    reports it)."""
    started = pod.started.strftime("%Y-%m-%dT%H:%M:%SZ")
    view = ContainerView(
        name="trainer", image="local", running_since=started,
        container_id=f"scalesim://{pod.name}", runs=1, probe_ready=ready,
    )  # fmt: skip
    return {"status": pod_status([view], pod.ip, "127.0.0.1", started, started, since={})}
