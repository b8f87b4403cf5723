"""Two runs of one tiny-GPT job, the same steps and seed: a clean one, then one under a
fault plan, on a control plane, local cluster and operator someone else started.

The clean run gives the time the steps take with nothing going wrong. The chaos run
follows the plan (support.chaos.schedule) with support.chaos.inject's Injector from this
(the main) thread, polling the job's status to time the pairs that must overlap a
recovery. It never touches the job: whatever heals the run is the operator's doing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from urllib3.exceptions import HTTPError

from support.chaos.inject import TRIGGER_KINDS, Injected, InjectionError, Injector
from support.chaos.schedule import Planned
from support.localnode import LocalCluster
from support.operator import Jobs
from support.timeline import Recorder
from support.tinygpt import StepLogs, job_manifest

Json = dict[str, Any]
RECOVERY_PHASES = ("Stopping", "Planning", "Relaunching")
FINISHED = ("Succeeded", "Failed")
POLL_SECONDS = 0.25
STALL_SECONDS = 15
"""The chaos job's detection.stallSeconds, set as a platform team sets it from its own step
time. Null (the default) sizes the bound from the step time but never below 120 s, meant
for real steps of seconds; with 0.06-0.2 s steps a hang would cost two minutes of a
15-minute run in detection alone. 15 s is five times the slowest tiny-GPT step seen on this
machine (3.1 s at load 15, tests/e2e/test_hangs.py); the long run's first used 30 s."""


def chaos_manifest(name: str, steps: int, seed: int, env: Mapping[str, str | None] = {}) -> Json:
    """The example job, healthy (no poisoned shard), `steps` steps of seed `seed`, its PFS
    part under the claim's `<name>/` so two runs in one namespace never share a file."""
    variables = {"TINYGPT_POISON_SHARDS": None, "TINYGPT_STEPS": str(steps),
                 "TINYGPT_SEED": str(seed), **env}  # fmt: skip
    manifest = job_manifest(name, variables, detection={"stallSeconds": STALL_SECONDS})
    manifest["spec"]["checkpoints"]["pfs"]["subPath"] = name
    return manifest


def pfs_dir(cluster: LocalCluster, namespace: str, name: str) -> Path:
    """The job's PFS part as this host sees it (the claim is `pfs`, subPath the job's name)."""
    return cluster.shared_dir / namespace / "pfs" / name


def step_logs(cluster: LocalCluster, namespace: str, name: str) -> StepLogs:
    return StepLogs(cluster.shared_dir, namespace, claim=f"pfs/{name}")


def read_status(jobs: Jobs, name: str) -> Json | None:
    """The job's status, or None while the API server cannot answer (it may be the fault)."""
    try:
        return jobs.status(name)
    except (client.ApiException, HTTPError, OSError):
        return None


@dataclass
class RunResult:
    """One run of the job, times from this host's clock (the ranks' logs use the same)."""

    name: str
    created_at: float
    status: Json
    logs: StepLogs
    gave_up_at: float | None = None
    """When the harness stopped waiting for a job that never finished."""

    @property
    def last_step(self) -> Json | None:
        for attempt in reversed(self.logs.attempts()):
            steps = self.logs.steps(attempt)
            if steps:
                return steps[-1]
        return None

    @property
    def first_step_at(self) -> float | None:
        curve = self.logs.curve()
        return min(float(r["time"]) for r in curve) if curve else None

    @property
    def training_seconds(self) -> float | None:
        """First step -> last step: the time the plan's moments are laid over."""
        last, first = self.last_step, self.first_step_at
        return None if last is None or first is None else float(last["time"]) - first

    @property
    def seconds(self) -> float | None:
        """Job created -> its last step logged: what the steps cost, start-up included; for
        a job that never finished, job created -> the harness gave up (the wall time spent)."""
        if self.gave_up_at is not None:
            return self.gave_up_at - self.created_at
        last = self.last_step
        return None if last is None else float(last["time"]) - self.created_at


def wait_finished(jobs: Jobs, name: str, timeout: float) -> Json:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = read_status(jobs, name)
        if status is not None and status.get("phase") in FINISHED:
            return status
        time.sleep(1.0)
    raise TimeoutError(f"job {name} did not finish within {timeout:.0f} s")


def clean_run(
    jobs: Jobs, cluster: LocalCluster, namespace: str, manifest: Json, timeout: float
) -> RunResult:
    name = manifest["metadata"]["name"]
    created_at = time.time()
    jobs.create(manifest)
    status = wait_finished(jobs, name, timeout)
    return RunResult(name, created_at, status, step_logs(cluster, namespace, name))


@dataclass
class Applied:
    """What became of one planned fault."""

    planned: Planned
    injected: Injected | None = None
    error: str = ""
    """Why it was not injected."""
    phase: str = ""
    """The job's phase when it struck (as last read)."""
    fired: Json | None = None
    """For NaN, hang and spike: where the rank that acted really struck (step, attempt,
    time, the shard a spike poisoned); None if it never did."""

    @property
    def overlapped(self) -> bool:
        """A pair's second fault struck while the job was recovering."""
        return self.phase in RECOVERY_PHASES


@dataclass
class ChaosRun:
    run: RunResult
    applied: list[Applied]
    recorder: Recorder


class Driver:
    """Applies a plan to the running job; `retry_seconds` bounds how long a fault that
    cannot strike now (no pod running during a relaunch, no checkpoint yet) is retried."""

    def __init__(
        self,
        injector: Injector,
        jobs: Jobs,
        name: str,
        rng: random.Random,
        *,
        retry_seconds: float = 60.0,
        recovering_timeout: float = 240.0,
        say: Any = print,
    ) -> None:
        self.injector = injector
        self.jobs = jobs
        self.name = name
        self.rng = rng
        self.retry_seconds = retry_seconds
        self.recovering_timeout = recovering_timeout
        self.say = say
        self.phase = ""

    def _poll(self) -> Json | None:
        for ended in self.injector.tick():
            self.say(f"  [chaos] {ended.kind} on {ended.target} ended")
        status = read_status(self.jobs, self.name)
        if status is not None:
            self.phase = str(status.get("phase", ""))
        return status

    def run(self, plan: list[Planned], logs: StepLogs, timeout: float) -> list[Applied]:
        """Every planned fault, in order, its moment counted from the job's first training
        step (pod start-up varies by tens of seconds with the machine's load); returns when
        the job has finished (or after `timeout`), with every timed fault ended."""
        applied = [Applied(p) for p in plan]
        deadline = time.time() + timeout
        try:
            while not logs.curve() and time.time() < deadline and self.phase not in FINISHED:
                self._poll()
                time.sleep(POLL_SECONDS)
            curve = logs.curve()
            started_at = min(float(r["time"]) for r in curve) if curve else time.time()
            for item in applied:
                self._apply(item, applied, started_at, deadline)
            while time.time() < deadline and self.phase not in FINISHED:
                self._poll()
                time.sleep(POLL_SECONDS)
        finally:
            self.injector.close()
        for item in applied:
            if item.injected is not None and item.injected.kind in TRIGGER_KINDS:
                item.fired = self.injector.fired(item.injected)
        return applied

    def _apply(
        self, item: Applied, applied: list[Applied], started_at: float, deadline: float
    ) -> None:
        planned = item.planned
        anchor = applied[planned.follows] if planned.follows is not None else None
        if anchor is not None and anchor.injected is None:
            item.error = f"not injected: #{anchor.planned.index} it follows was not"
            return
        due = started_at + planned.at
        give_up = due + self.retry_seconds
        if anchor is not None and anchor.injected is not None:
            due = anchor.injected.at
            give_up = due + self.recovering_timeout
        # A pair's "recovering" waits until the job was seen out of recovery since the fault
        # it follows: the next recovery phase seen is then one that fault started.
        armed = False
        while time.time() < deadline:
            self._poll()
            if self.phase in FINISHED:
                item.error = f"not injected: the job was {self.phase} first"
                return
            now = time.time()
            recovering = self.phase in RECOVERY_PHASES
            armed = armed or not recovering
            waiting = planned.after == "recovering" and not (armed and recovering)
            if now >= due and (not waiting or now >= give_up):
                try:
                    item.phase = self.phase
                    item.injected = self.injector.inject(planned.kind, self.rng)
                    shown = item.injected
                    self.say(f"  [chaos] {planned.describe()}: {shown.kind} on {shown.target} "
                             f"({item.phase}): {shown.detail}")  # fmt: skip
                    return
                except InjectionError as error:
                    if time.time() >= give_up:
                        item.error = f"not injected: {error}"
                        return
            time.sleep(POLL_SECONDS)
        item.error = "not injected: the run's time was up"


def chaos_run(
    injector: Injector,
    jobs: Jobs,
    *,
    cluster: LocalCluster,
    api_client: client.ApiClient,
    namespace: str,
    manifest: Json,
    plan: list[Planned],
    seed: int,
    timeout: float,
    say: Any = print,
) -> ChaosRun:
    name = manifest["metadata"]["name"]
    with Recorder(api_client, namespace, name) as recorder:
        created_at = time.time()
        jobs.create(manifest)
        driver = Driver(injector, jobs, name, random.Random(seed), say=say)
        logs = step_logs(cluster, namespace, name)
        applied = driver.run(plan, logs, timeout)
        status: Json = {}
        gave_up_at = None
        try:
            status = wait_finished(jobs, name, 60)
        except TimeoutError:
            gave_up_at = time.time()
            status = read_status(jobs, name) or {}
        recorder.stop()
    return ChaosRun(RunResult(name, created_at, status, logs, gave_up_at), applied, recorder)
