"""What one operator costs the API server and itself per job, and how fast it sees a trip.

The real control plane (etcd, kube-apiserver, kube-controller-manager), the CRD, and the
operator as its own process, exactly as the integration tests run it. No training runs:
a simulated kubelet in this process binds the jobs' pods to a few simulated Nodes, gives
each an address on loopback and marks it Running, and one asyncio server per pod answers
its agent status endpoint with a healthy, advancing AgentStatus (tests/support/scalesim.py).

For each size (jobs of 4 pods), after every job reached Running and a settle time:

- API requests per job per minute at steady state, from kube-apiserver's own
  ``apiserver_request_total`` diffed over the window; the simulated kubelet's own requests
  (Node leases and status, pod bindings and status) are left out, and the rest is listed by
  verb and resource so it shows where the requests go;
- the operator's CPU (utime+stime from /proc over the window, in % of one core) and RSS;
- trip-to-Stopping latency: every pod of each of ``--trips`` jobs ends as a tripped agent's
  does (Failed, the TripReport as its termination message; all ranks trip at the same step,
  their status writes made at once), one job every ``--trip-gap`` seconds; the time from
  the moment every pod's Failed status was stored to the job's status.phase leaving
  Running, as seen by a watch on the jobs, p50 and p99 (and from the moment the writes
  began, which adds the API server's write latency under the load);
- the operator's CPU once every job has Succeeded (``--finished-window``): finished jobs
  pile up on a cluster, and have nothing left to do.

    PYTHONPATH=tests .venv/bin/python bench/operator_scale.py [--jobs 100 300] [--window 60]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from stabletrain_contract.supervisor import ProcessState
from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION
from support.controlplane import ControlPlane, request_counts, running_control_plane
from support.operator import create_claim, install_crd, job_manifest
from support.processes import ManagedProcess, free_port
from support.scalesim import ScaleSimulator

PODS_PER_JOB = 4
KUBELET_REQUESTS = {
    ("leases", ""),
    ("nodes", "status"),
    ("pods", "binding"),
    ("pods", "status"),
}
"""(resource, subresource) only the simulated kubelet and nodes write at steady state."""
CONTROLLER_REQUESTS = {("endpoints", ""), ("endpointslices", "")}
"""What kube-controller-manager writes for the jobs' headless Services (not the operator)."""
READS_SETTLE_SECONDS = 10.0
"""Pause between the window's closing reads and the first trip. Those reads (kube-apiserver's
/metrics and two LISTs of the namespace's Events) kept the API server busy for seconds at
1,000 jobs, and the first trips' status writes and watch events waited behind them."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
OPERATOR_COMPONENT = "stabletrain.dev/operator"
"""reportingComponent of the operator's Events (stabletrain_operator.kube)."""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


class PhaseWatch:
    """Every job's phase, as a watch on the namespace's jobs delivers it, with arrival times."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.phases: dict[str, str] = {}
        self.changed_at: dict[tuple[str, str], float] = {}
        self.history: list[tuple[str, str, float]] = []
        """Every phase change in arrival order: a phase may come back (Running again)."""
        self._stop = threading.Event()
        self._handle: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PhaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.stop()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        custom: Any = client.CustomObjectsApi(self.api_client)
        while not self._stop.is_set():
            self._handle = watch.Watch()
            with contextlib.suppress(Exception):
                for event in self._handle.stream(
                    custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL,
                    timeout_seconds=60,
                ):  # fmt: skip
                    job = event["object"]
                    name = job["metadata"]["name"]
                    phase = (job.get("status") or {}).get("phase") or "Pending"
                    if self.phases.get(name) != phase:
                        self.phases[name] = phase
                        self.changed_at.setdefault((name, phase), time.monotonic())
                        self.history.append((name, phase, time.monotonic()))

    def count(self, phase: str) -> int:
        return sum(1 for p in list(self.phases.values()) if p == phase)

    def left_running_at(self, name: str) -> float | None:
        times = [t for (n, p), t in list(self.changed_at.items()) if n == name and p != "Running"]
        running = self.changed_at.get((name, "Running"))
        later = [t for t in times if running is not None and t > running]
        return min(later) if later else None


@contextlib.contextmanager
def operator_process(
    plane: ControlPlane, namespace: str, workdir: Path, agent_port: int, metrics_port: int
) -> Iterator[ManagedProcess]:
    argv = [
        sys.executable, "-m", "stabletrain_operator", "--namespace", namespace,
        "--metrics-port", str(metrics_port), "--agent-port", str(agent_port),
        "--liveness", f"http://127.0.0.1:{free_port()}/healthz",
    ]  # fmt: skip
    process = ManagedProcess("operator", argv, workdir / "operator.log", env=plane.env())
    try:
        yield process
    finally:
        process.stop()


@contextlib.contextmanager
def sampled(pid: int, into: Path | None, name: str, seconds: float) -> Iterator[None]:
    """py-spy samples `pid` for `seconds` into `into`/`name`.txt (collapsed stacks, one line
    per stack with its sample count), so the steady window's CPU can be read by function.
    Nothing without `into`; py-spy is not a dependency (`pip install py-spy`)."""
    if into is None:
        yield
        return
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy on PATH (pip install py-spy)")
    into.mkdir(parents=True, exist_ok=True)
    argv = [spy, "record", "--pid", str(pid), "--duration", str(math.ceil(seconds)),
            "--rate", "50", "--nonblocking", "--format", "raw",
            "--output", str(into / f"{name}.txt")]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as spying:
        try:
            yield
        finally:
            try:
                spying.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spying.kill()


def wait_for(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1.0)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


@dataclasses.dataclass(frozen=True)
class Cluster:
    plane: ControlPlane
    core: Any
    custom: Any
    namespace: str
    simulator: ScaleSimulator
    operator: ManagedProcess
    phases: PhaseWatch
    metrics_port: int


PACER_GAUGES = {
    "stabletrain_operator_scrape_rate": "scrape rate",
    "stabletrain_operator_event_loop_lag_seconds": "loop lag (s)",
}


def pacer_state(port: int) -> str:
    """The operator's scrape budget and the loop lag it follows, from its own /metrics
    (an operator without them, an older one, says so)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except OSError as error:
        return f"metrics unreadable: {error}"
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in PACER_GAUGES:
            found[PACER_GAUGES[name]] = f"{float(value):.3g}"
    return ", ".join(f"{k} {v}" for k, v in found.items()) or "no pacer gauges"


@contextlib.contextmanager
def simulated_cluster(nodes: int = 4) -> Iterator[Cluster]:
    """A fresh control plane with the CRD, a namespace and its claim, the simulated kubelet
    and agents on `nodes` Nodes, the operator and a watch on the jobs' phases."""
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as scratch, running_control_plane(
    ) as plane:  # fmt: skip
        install_crd(plane)
        api: Any = config.new_client_from_config(config_file=str(plane.kubeconfig))
        core: Any = client.CoreV1Api(api)
        namespace = f"scale-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": namespace}})
        create_claim(core, namespace)
        simulator = ScaleSimulator(api, namespace, nodes=nodes)
        simulator.start()
        try:
            metrics_port = free_port()
            with operator_process(
                plane, namespace, Path(scratch), free_port(), metrics_port
            ) as operator, (
                PhaseWatch(api, namespace)
            ) as phases:  # fmt: skip
                custom = client.CustomObjectsApi(api)
                yield Cluster(
                    plane, core, custom, namespace, simulator, operator, phases, metrics_port
                )
        finally:  # the control plane goes with its jobs: no need to delete them one by one
            simulator.stop()
            api.close()


def measure(args: argparse.Namespace, jobs: int) -> dict[str, Any]:
    """One size on a fresh control plane; the row of the table."""
    with simulated_cluster() as cluster:
        plane, core, custom, namespace = cluster.plane, cluster.core, cluster.custom, (
            cluster.namespace
        )  # fmt: skip
        simulator, operator, phases = cluster.simulator, cluster.operator, cluster.phases
        names = [f"job-{i:04d}" for i in range(jobs)]
        began = time.monotonic()
        for name in names:
            custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                job_manifest(name, {}, nodes=PODS_PER_JOB, recovery={"restart": args.restart}),
            )
        wait_for(
            f"{jobs} jobs Running", lambda: phases.count("Running") == jobs,
            args.start_timeout,
        )  # fmt: skip
        started_in = time.monotonic() - began
        time.sleep(args.settle)
        if not operator.alive():
            raise SystemExit(f"operator exited:\n{operator.log_tail()}")
        foreign_before, answered_before = foreign_event_writes(core, namespace), (
            simulator.counts.answered
        )  # fmt: skip
        before, cpu_before, t0 = request_counts(plane), cpu_seconds(operator.pid), (
            time.monotonic()
        )  # fmt: skip
        with sampled(operator.pid, args.profile, f"operator-{jobs}-jobs", args.window):
            time.sleep(args.window)
        after, cpu_after, t1 = request_counts(plane), cpu_seconds(operator.pid), (
            time.monotonic()
        )  # fmt: skip
        pacer_at_window_end = pacer_state(cluster.metrics_port)
        answered = simulator.counts.answered - answered_before
        foreign = foreign_event_writes(core, namespace) - foreign_before
        rss = rss_mib(operator.pid)
        minutes = (t1 - t0) / 60
        diff = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k)}
        others = KUBELET_REQUESTS | CONTROLLER_REQUESTS
        operator_side = without_foreign_events(
            {k: v for k, v in diff.items() if (k[1], k[2]) not in others}, foreign
        )
        controller = foreign + sum(
            v for k, v in diff.items() if (k[1], k[2]) in CONTROLLER_REQUESTS
        )
        events = event_sources(core, namespace)
        phase_counts = collections.Counter(phases.phases.values())
        time.sleep(READS_SETTLE_SECONDS)
        trips = inject_trips(args, simulator, phases, names)
        time.sleep(1.0)  # the decisions' log lines flushed
        breakdown = where_the_time_went(operator.log_path, trips)
        pacer_after_trips = pacer_state(cluster.metrics_port)
        finished_cpu = finished_jobs_cpu(args, simulator, phases, operator.pid, jobs)
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(operator.log_path, args.logs / f"operator-{jobs}-jobs.log")
        return {
            "phases": dict(phase_counts),
            "jobs": jobs,
            "pods": jobs * PODS_PER_JOB,
            "started_in": started_in,
            "requests_per_job_minute": sum(operator_side.values()) / jobs / minutes,
            "requests_per_second": sum(operator_side.values()) / (t1 - t0),
            "kubelet_per_second": (sum(diff.values()) - sum(operator_side.values()) - controller)
            / (t1 - t0),
            "controller_per_second": controller / (t1 - t0),
            "events": events,
            "window": t1 - t0,
            "cpu_percent": 100 * (cpu_after - cpu_before) / (t1 - t0),
            "rss_mib": rss,
            "trips": trips,
            "trip_stages": breakdown,
            "breakdown": collections.Counter(operator_side).most_common(12),
            "answered": answered,
            "errors": simulator.counts.errors[:5],
            "pacer": (pacer_at_window_end, pacer_after_trips),
            "finished_cpu": finished_cpu,
            "window_finished": args.finished_window,
        }


def finished_jobs_cpu(
    args: argparse.Namespace, simulator: ScaleSimulator, phases: PhaseWatch, pid: int, jobs: int
) -> float | None:
    """The operator's CPU (% of a core) over `--finished-window` once every job Succeeded:
    each pod the simulator runs ends with exit code 0 (a tripped job's relaunched pods too)
    until every job's phase is Succeeded. A finished job has nothing left to do."""
    if args.finished_window <= 0:
        return None
    deadline = time.monotonic() + args.start_timeout
    while phases.count("Succeeded") < jobs:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {phases.count('Succeeded')} of {jobs} jobs Succeeded")
        simulator.finish(*(pod.name for pod in simulator.running_pods()))
        time.sleep(2.0)
    time.sleep(READS_SETTLE_SECONDS)
    before, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(args.finished_window)
    return 100 * (cpu_seconds(pid) - before) / (time.monotonic() - t0)


def measure_big_job(args: argparse.Namespace) -> dict[str, Any]:
    """One job of `--big-job` nodes: a trip, and how long each part of its recovery takes."""
    size = args.big_job
    with simulated_cluster(args.big_job_nodes) as cluster:
        custom, namespace = cluster.custom, cluster.namespace
        simulator, operator, phases = cluster.simulator, cluster.operator, cluster.phases
        custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            job_manifest("big", {}, nodes=size, recovery={"restart": args.restart}),
        )
        began = time.monotonic()
        wait_for("the big job to run", lambda: phases.phases.get("big") == "Running",
                 args.start_timeout)  # fmt: skip
        started_in = time.monotonic() - began
        time.sleep(args.settle)
        if not operator.alive():
            raise SystemExit(f"operator exited:\n{operator.log_tail()}")
        first = sorted(p.name for p in simulator.running_pods() if "-a0-" in p.name)
        tripped_at = time.monotonic()
        simulator.trip(first[0])
        times = recovery_times(simulator, phases, tripped_at, size, args.start_timeout)
        job = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "big")
        return {
            "nodes": size,
            "simulated_nodes": args.big_job_nodes,
            "started_in": started_in,
            **times,
            "object_bytes": len(json.dumps(job)),
            "status_bytes": len(json.dumps(job.get("status") or {})),
            "trip_report_bytes": len(simulator.last_trip_message),
            "rss_mib": rss_mib(operator.pid),
        }


def recovery_times(
    simulator: ScaleSimulator, phases: PhaseWatch, tripped_at: float, size: int, timeout: float
) -> dict[str, float]:
    """Seconds from the trip to each milestone, as the simulator and the job watch saw them."""
    seen: dict[str, float] = {}
    deadline = tripped_at + timeout
    bound, deleted = simulator.counts.bound, simulator.counts.deleted
    while time.monotonic() < deadline and "relaunched" not in seen:
        now = time.monotonic()
        pods = list(simulator.running_pods())
        old = [p for p in pods if p.attempt == 0]
        if "stopped" not in seen and all(p.process is not ProcessState.RUNNING for p in old):
            seen["stopped"] = now - tripped_at
        running = [p for p in pods if p.attempt == 1 and p.process is ProcessState.RUNNING]
        if "stopped" in seen and len(running) == size:
            seen["relaunched"] = now - tripped_at
        time.sleep(0.05)
    seen["pods created"] = simulator.counts.bound - bound
    seen["pods deleted"] = simulator.counts.deleted - deleted
    for name, phase, at in list(phases.history):
        if name == "big" and at >= tripped_at:
            seen.setdefault(f"phase {phase}", at - tripped_at)
    return seen


def print_big_job(row: dict[str, Any]) -> None:
    def at(key: str) -> str:
        return f"{row[key]:.1f} s" if key in row else "never"

    print(
        f"\none job of {row['nodes']} nodes (pods spread over {row['simulated_nodes']} "
        f"simulated Nodes), Running {row['started_in']:.0f} s after it was created; one pod "
        "trips:\n"
        f"  trip -> Stopping {at('phase Stopping')} | every pod stopped {at('stopped')} | "
        f"Planning {at('phase Planning')} | plan made (Relaunching) {at('phase Relaunching')} "
        f"| every rank running the next attempt {at('relaunched')} | "
        f"Confirming (rollback) {at('phase Confirming')}; pods created "
        f"{row['pods created']:.0f}, deleted {row['pods deleted']:.0f}\n"
        f"  job object {row['object_bytes'] / 1024:.1f} KiB "
        f"(status {row['status_bytes'] / 1024:.1f} KiB); "
        f"trip report {row['trip_report_bytes']} bytes (the agent caps it at 4 KiB); "
        f"operator RSS {row['rss_mib']:.0f} MiB"
    )


def inject_trips(
    args: argparse.Namespace, simulator: ScaleSimulator, phases: PhaseWatch, names: list[str]
) -> list[Trip]:
    """Trip every pod of each of `--trips` jobs spread over the list, the pods of one job all
    at once; for each, seconds to Stopping from the moment every pod's Failed status was
    stored (what the operator can act on) and from the moment the writes began."""
    spread = names[:: max(1, len(names) // args.trips)] + names
    injected: dict[str, tuple[float, float, datetime]] = {}
    for name in dict.fromkeys(spread):
        if len(injected) == args.trips:
            break
        running = [p.name for p in simulator.running_pods() if p.name.startswith(f"{name}-a")]
        if phases.phases.get(name) != "Running" or not running:
            continue  # a job that is not running (or has no running pod) cannot trip
        began = time.monotonic()
        simulator.trip(*running)  # every rank trips at the same step (one consensus)
        injected[name] = (time.monotonic(), began, datetime.now())
        print(f"  tripped {name}: {len(running)} pods stored at {injected[name][2]:%H:%M:%S.%f}"
              f" after {injected[name][0] - began:.2f} s", flush=True)  # fmt: skip
        time.sleep(args.trip_gap)
    chosen = list(injected)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(phases.left_running_at(n) is None for n in chosen):
        time.sleep(0.2)
    trips = []
    for name, (stored, began, wall) in injected.items():
        left = phases.left_running_at(name)
        trips.append(Trip(name, wall, math.inf if left is None else left - stored,
                          math.inf if left is None else left - began))  # fmt: skip
    print("  trip -> left Running (s): " + " ".join(f"{t.stored:.2f}" for t in trips))
    return trips


@dataclasses.dataclass(frozen=True)
class Trip:
    job: str
    stored_at: datetime
    """Wall clock (local, as the operator's log) when every pod's trip was stored."""
    stored: float
    """Seconds from then to the job's watch showing it left Running."""
    began: float
    """Seconds from the first of the trip's writes to the same."""


PHASE_LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \S+: job (?P<job>\S+): "
    r"Running -> Stopping \((?P<stages>[^)]*)\)$"
)
STAGE = re.compile(r"(?P<stage>[a-z ]+?) (?P<seconds>\d+\.\d+) s")


def where_the_time_went(log: Path, trips: list[Trip]) -> dict[str, list[float]]:
    """Each trip's seconds split at the operator's log line of its decision (reconcile.py's
    StageClock): until a watch event woke the job's daemon (the pod event's way through the
    API server and kopf), the wake's wait for a free loop, each stage of the deciding tick,
    and from the status write's return to the bench's watch seeing it."""
    lines: dict[str, re.Match[str]] = {}
    for line in log.read_text(errors="replace").splitlines():
        found = PHASE_LINE.match(line)
        if found:
            lines.setdefault(found["job"], found)
    parts: dict[str, list[float]] = collections.defaultdict(list)
    for trip in trips:
        found = lines.get(trip.job)
        if found is None or math.isinf(trip.stored):
            continue
        logged = datetime.strptime(found["at"], "%Y-%m-%d %H:%M:%S,%f")
        stages = {m["stage"].strip(): float(m["seconds"]) for m in STAGE.finditer(found["stages"])}
        in_operator = sum(stages.values())
        to_line = (logged - trip.stored_at).total_seconds()
        parts["stored -> the daemon woken"].append(to_line - in_operator)
        for stage, seconds in stages.items():
            parts["woken -> its tick began" if stage == "woken" else stage].append(seconds)
        parts["written -> seen by a watch"].append(trip.stored - to_line)
    return parts


def p50(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s" if values else "-"


def p99(values: list[float]) -> str:
    return f"{percentile(values, 0.99):.2f} s" if values else "-"


def print_table(rows: list[dict[str, Any]]) -> None:
    print()
    print(
        "| jobs | pods | all Running after | API req/job/min | API req/s | operator CPU "
        "| operator RSS | trip->Stopping p50 | p99 | trips | from the first write p50 | p99 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        stored = [t.stored for t in row["trips"]]
        began = [t.began for t in row["trips"]]
        print(
            f"| {row['jobs']} | {row['pods']} | {row['started_in']:.0f} s "
            f"| {row['requests_per_job_minute']:.1f} | {row['requests_per_second']:.1f} "
            f"| {row['cpu_percent']:.0f}% | {row['rss_mib']:.0f} MiB | {p50(stored)} "
            f"| {p99(stored)} | {len(stored)} | {p50(began)} | {p99(began)} |"
        )
    for row in rows:
        print(f"\n{row['jobs']} jobs: operator requests by verb/resource/subresource (per s):")
        for (verb, resource, sub), count in row["breakdown"]:
            what = resource + (f"/{sub}" if sub else "")
            print(f"  {verb:7} {what:34} {count / row['window']:7.2f}")
        print(
            f"  (left out: kube-controller-manager's endpoints, endpointslices and Events "
            f"{row['controller_per_second']:.2f}/s, the simulated kubelet and nodes "
            f"{row['kubelet_per_second']:.2f}/s; "
            f"agent status answers: {row['answered'] / row['window']:.0f}/s; "
            f"simulator errors: {row['errors'] or 0})"
        )
        print(f"  job phases at the end of the window: {row['phases']}")
        print("  where a trip's seconds went (p50 / p99 / max; the operator's log of each "
              "decision):")  # fmt: skip
        for part, values in row["trip_stages"].items():
            print(f"    {part:34} {p50(values)} / {p99(values)} / {max(values):.2f} s")
        if row["finished_cpu"] is not None:
            print(f"  operator CPU once every job Succeeded: {row['finished_cpu']:.1f}% "
                  f"(over {row['window_finished']:.0f} s)")  # fmt: skip
        print(f"  operator's pacer at the window's end: {row['pacer'][0]}; "
              f"after the trips: {row['pacer'][1]}")  # fmt: skip
        print("  Events in the namespace by source and reason (count incl. repeats):")
        for (source, reason), count in row["events"]:
            print(f"    {source:28} {reason:32} {count}")


def foreign_event_writes(core: Any, namespace: str) -> int:
    """Event writes so far by others than the operator (each occurrence is one POST or, for a
    repeat, one PATCH): the API server counts Events by verb only, not by who wrote them."""
    total = 0
    for event in core.list_namespaced_event(namespace).items:
        if event.reporting_component != OPERATOR_COMPONENT:
            total += event.count or 1
    return total


def without_foreign_events(
    requests: dict[tuple[str, str, str], float], foreign: int
) -> dict[tuple[str, str, str], float]:
    """The operator's requests: the Event writes of others taken off, repeats (PATCH) first."""
    kept = dict(requests)
    for verb in ("PATCH", "POST"):
        key = (verb, "events", "")
        taken = min(kept.get(key, 0.0), foreign)
        foreign -= int(taken)
        if key in kept:
            kept[key] -= taken
            if not kept[key]:
                del kept[key]
    return kept


def event_sources(core: Any, namespace: str) -> list[tuple[tuple[str, str], int]]:
    """Who posts the namespace's Events and why, summed over repeats, most first."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for event in core.list_namespaced_event(namespace).items:
        source = event.reporting_component or (event.source.component if event.source else "")
        counts[(source or "?", event.reason or "?")] += event.count or 1
    return counts.most_common(8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--with-1000", action="store_true", help="also 1000 jobs (4000 pods)")
    parser.add_argument("--window", type=float, default=60.0, help="steady-state seconds")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after all Running")
    parser.add_argument("--trips", type=int, default=20)
    parser.add_argument("--trip-gap", type=float, default=0.5, help="seconds between trips")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument(
        "--finished-window", type=float, default=20.0,
        help="seconds the operator's CPU is measured once every job Succeeded (0: not)",
    )  # fmt: skip
    parser.add_argument("--big-job", type=int, default=0, help="also one job of N nodes")
    parser.add_argument("--big-job-nodes", type=int, default=64, help="simulated Nodes for it")
    parser.add_argument(
        "--restart", default="InPlace", choices=("InPlace", "RecreatePods"),
        help="spec.recovery.restart of every job",
    )  # fmt: skip
    parser.add_argument(
        "--logs", type=Path, default=None, help="keep the operator's log of each size in DIR"
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="py-spy the operator's steady window into DIR"
    )
    args = parser.parse_args()
    sizes = [*args.jobs, *([1000] if args.with_1000 else [])]
    if any(size < args.trips for size in sizes):
        raise SystemExit("every size needs at least --trips jobs")
    print(
        f"operator at scale: jobs of {PODS_PER_JOB} pods, steady window {args.window:.0f} s "
        f"after {args.settle:.0f} s settle; load average "
        + " ".join(f"{v:.2f}" for v in os.getloadavg())
    )
    rows = []
    for size in sizes:
        rows.append(measure(args, size))
        print(f"  {size} jobs measured; load average " + " ".join(
            f"{v:.2f}" for v in os.getloadavg()))  # fmt: skip
        print_table(rows[-1:])  # each size as soon as it is measured
    if len(rows) > 1:
        print_table(rows)
    if args.big_job:
        print_big_job(measure_big_job(args))


if __name__ == "__main__":
    main()
