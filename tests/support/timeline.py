"""The recovery timeline of a job, measured from the outside as it happens.

A recorder watches the job and its pods on the API server and stamps every change with
this host's clock when it arrives (the API server's own timestamps have one-second
resolution); the ranks' step logs carry the same clock. From both, `rollback_timeline`
lays out one rollback: the anomalous step, the agent's trip, the operator's detection (the
job enters Stopping), pods gone (Planning), plan made (Relaunching), the next attempt's
pods running, its first step, and the directives confirmed (Confirming left behind).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import client, watch

from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION
from stabletrain_operator.naming import ATTEMPT_LABEL, job_selector
from support.tinygpt import StepLogs

Json = dict[str, Any]
_WATCH: Any = watch.Watch
"""The client's watch helper is untyped."""


@dataclass(frozen=True)
class Seen:
    at: float
    """time.time() when the change arrived."""
    kind: str
    """"job" or "pod"."""
    event: str
    """ADDED, MODIFIED, DELETED."""
    obj: Json


class Recorder:
    """Watches one job and its pods in background threads until `stop()`."""

    def __init__(self, api_client: client.ApiClient, namespace: str, job: str) -> None:
        self.api_client: Any = api_client
        self.namespace = namespace
        self.job = job
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        custom: Any = client.CustomObjectsApi(api_client)
        core: Any = client.CoreV1Api(api_client)
        job_args = (GROUP, VERSION, namespace, PLURAL)
        watches = [
            ("job", custom.list_namespaced_custom_object, job_args,
             {"field_selector": f"metadata.name={job}"}),
            ("pod", core.list_namespaced_pod, (namespace,), {"label_selector": job_selector(job)}),
        ]  # fmt: skip
        self._threads = [
            threading.Thread(target=self._watch, args=args, daemon=True) for args in watches
        ]

    def __enter__(self) -> Recorder:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _watch(
        self, kind: str, lister: Callable[..., Any], args: tuple[Any, ...], kw: Json
    ) -> None:
        version = ""
        while not self._stopping.is_set():
            stream: Any = _WATCH()
            try:
                for item in stream.stream(
                    lister, *args, resource_version=version, timeout_seconds=1, **kw
                ):
                    obj = item["object"]
                    plain = (
                        obj
                        if isinstance(obj, dict)
                        else self.api_client.sanitize_for_serialization(obj)
                    )
                    version = plain["metadata"].get("resourceVersion", version)
                    with self._lock:
                        self.seen.append(Seen(time.time(), kind, item["type"], plain))
                    if self._stopping.is_set():
                        break
            except client.ApiException as error:
                if error.status == 410:  # resource version too old: list afresh
                    version = ""
                time.sleep(0.1)
            except Exception:  # a dropped connection: watch again
                time.sleep(0.1)
            finally:
                stream.stop()

    def snapshot(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def phases(self) -> list[tuple[float, str, Json]]:
        """(arrival time, phase, status) at every change of the job's phase."""
        changes: list[tuple[float, str, Json]] = []
        for seen in self.snapshot():
            if seen.kind != "job" or seen.event == "DELETED":
                continue
            status = seen.obj.get("status") or {}
            phase = str(status.get("phase", ""))
            if not changes or changes[-1][1] != phase:
                changes.append((seen.at, phase, status))
        return changes

    def wait_phase(self, phases: Iterable[str], timeout: float, what: str) -> Json:
        """The job's status when the watch first showed it in one of `phases`. A phase a
        status poll can miss (a rollback's Stopping to Relaunching lasts about a second) is
        still seen here, since every status write arrives as its own watch event."""
        wanted = set(phases)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for _, phase, status in self.phases():
                if phase in wanted:
                    return status
            time.sleep(0.05)
        seen = [phase for _, phase, _ in self.phases()]
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; phases: {seen}")

    def pods_of(self, attempt: int) -> set[str]:
        """Names of the pods the watch saw labelled with `attempt` (kept ones included)."""
        return {
            str((seen.obj.get("metadata") or {}).get("name"))
            for seen in self.snapshot()
            if seen.kind == "pod"
            and ((seen.obj.get("metadata") or {}).get("labels") or {}).get(ATTEMPT_LABEL)
            == str(attempt)
        }

    def pods_running(self, attempt: int, count: int) -> float | None:
        """When `count` pods of `attempt` had first been seen Running."""
        first: dict[str, float] = {}
        for seen in self.snapshot():
            meta = seen.obj.get("metadata") or {}
            if seen.kind != "pod" or (meta.get("labels") or {}).get(ATTEMPT_LABEL) != str(attempt):
                continue
            if (seen.obj.get("status") or {}).get("phase") == "Running":
                first.setdefault(str(meta.get("name")), seen.at)
        return sorted(first.values())[count - 1] if len(first) >= count else None


@dataclass(frozen=True)
class StartStages:
    """When the last rank of an attempt got past each stage of its start (train.py's start
    record): the script's main entered (behind it torchrun's rendezvous and, started cold,
    the interpreter's imports), the process group joined, the model, data and agent built,
    the planned checkpoint restored."""

    entered_at: float
    joined_at: float
    built_at: float
    restored_at: float

    @classmethod
    def of(cls, logs: StepLogs, attempt: int, ranks: int) -> StartStages | None:
        starts = [
            next((e for e in logs.events(attempt, rank) if e["event"] == "start"), None)
            for rank in range(ranks)
        ]
        if any(s is None or "entered" not in s for s in starts):
            return None  # a rank that never started, or a script that does not say
        known = [s for s in starts if s is not None]
        return cls(*(max(float(s[key]) for s in known)
                     for key in ("entered", "joined", "built", "time")))  # fmt: skip


@dataclass(frozen=True)
class RollbackTimeline:
    """One rollback, times in seconds since the epoch (None: not observed)."""

    from_attempt: int
    onset_step: int
    trip_step: int
    resume_step: int
    anomalous_step_at: float
    trip_at: float
    detected_at: float
    stopped_at: float
    planned_at: float
    relaunched_at: float | None
    first_resumed_step_at: float | None
    confirmed_at: float | None
    restarted_in_place: int = 0
    """Pods of the next attempt whose processes were restarted in place."""
    replaced: int = 0
    """Pods of the next attempt created anew."""
    start: StartStages | None = None
    """Where the next attempt's start went, from its ranks' own start records."""

    @property
    def steps_lost(self) -> int:
        """Steps trained and thrown away: from the checkpoint resumed to the trip."""
        return self.trip_step - self.resume_step

    def since_detection(self, at: float | None) -> float | None:
        return None if at is None else at - self.detected_at

    def rows(self) -> list[tuple[str, float | None, str]]:
        """(what, seconds after the anomalous step, detail) in order, for printing."""

        def rel(at: float | None) -> float | None:
            return None if at is None else at - self.anomalous_step_at

        after = self.from_attempt + 1
        return [
            ("anomalous step", rel(self.anomalous_step_at),
             f"step {self.onset_step} (attempt {self.from_attempt})"),
            ("agent tripped", rel(self.trip_at), f"step {self.trip_step}, all ranks"),
            ("operator detected", rel(self.detected_at), "job phase Stopping"),
            ("pods stopped", rel(self.stopped_at), "processes ended, phase Planning"),
            ("plan made", rel(self.planned_at),
             f"resume from step {self.resume_step}, phase Relaunching"),
            ("pods relaunched", rel(self.relaunched_at),
             f"attempt {after} started: {self.restarted_in_place} pod(s) in place, "
             f"{self.replaced} new"),
            *(
                [("script entered", rel(self.start.entered_at), "every rank's main()"),
                 ("process group joined", rel(self.start.joined_at), "gloo"),
                 ("model, data, agent", rel(self.start.built_at), "built"),
                 ("checkpoint restored", rel(self.start.restored_at), "every rank")]
                if self.start is not None else []
            ),
            ("first resumed step", rel(self.first_resumed_step_at), f"step {self.resume_step + 1}"),
            ("directives confirmed", rel(self.confirmed_at), "phase Confirming left"),
        ]  # fmt: skip


def _at(value: object) -> float:
    """A time as the status writes it (ISO 8601), or already seconds since the epoch."""
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


_STARTED = re.compile(r"^(\S+ \S+) stabletrain-supervisor supervisor: attempt (\d+) started", re.M)


def supervisor_started(pod_log: str, attempt: int) -> float | None:
    """When the pod's supervisor started `attempt` (its log's clock is this host's)."""
    for stamp, started in _STARTED.findall(pod_log):
        if int(started) == attempt:
            return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def _relaunched(
    recorder: Recorder, attempt: int, nodes: int, pod_log: Callable[[str], str] | None
) -> tuple[float | None, int, int]:
    """When every pod of `attempt` ran it (each supervised pod from its supervisor's log:
    a pod kept in place was Running all along), and how many were kept and new."""
    names = recorder.pods_of(attempt)
    job_prefix = f"{recorder.job}-a{attempt}-"
    kept = sum(1 for name in names if not name.startswith(job_prefix))
    new = len(names) - kept
    if pod_log is None:
        return recorder.pods_running(attempt, nodes), kept, new
    times = [supervisor_started(pod_log(name), attempt) for name in names]
    if len(times) < nodes or any(t is None for t in times):
        return recorder.pods_running(attempt, nodes), kept, new
    return max(t for t in times if t is not None), kept, new


def rollback_timeline(
    recorder: Recorder,
    logs: StepLogs,
    nodes: int = 2,
    episode: int = 0,
    pod_log: Callable[[str], str] | None = None,
) -> RollbackTimeline:
    """The `episode`-th rollback the recorder saw (0: the first); `pod_log(name)` reads a
    pod's log, for the moment its supervisor started the next attempt."""
    phases = recorder.phases()
    stops = [i for i, (_, phase, _) in enumerate(phases) if phase == "Stopping"]
    if len(stops) <= episode:
        raise AssertionError(f"no rollback #{episode} seen; phases: {[p for _, p, _ in phases]}")
    start = stops[episode]
    detected_at, _, status = phases[start]
    from_attempt = int(status.get("attempt", 0))
    trip = status.get("lastTrip") or {}

    def first(phase: str, after: int) -> tuple[float, Json] | None:
        for at, name, state in phases[after:]:
            if name == phase:
                return at, state
        return None

    stopped = first("Planning", start)
    planned = first("Relaunching", start)
    if stopped is None or planned is None:
        raise AssertionError(
            f"rollback #{episode} never planned; phases: {[p for _, p, _ in phases]}"
        )
    plan = planned[1].get("plan") or stopped[1].get("plan") or {}
    confirming = next(
        (i for i, (_, p, _) in enumerate(phases) if i > start and p == "Confirming"), None
    )
    confirmed_at = None
    if confirming is not None and confirming + 1 < len(phases):
        confirmed_at = phases[confirming + 1][0]
    before = {r["step"]: r["time"] for r in logs.steps(from_attempt)}
    if not trip:  # a failure (a killed rank): it struck right after the last step finished
        last = max(before)
        trip = {"step": last, "onsetStep": last, "trippedAt": before[last]}
    onset = int(trip.get("onsetStep") or plan.get("onsetStep") or trip["step"])
    resumed = logs.steps(from_attempt + 1)
    relaunched_at, kept, new = _relaunched(recorder, from_attempt + 1, nodes, pod_log)
    return RollbackTimeline(
        from_attempt=from_attempt,
        onset_step=onset,
        trip_step=int(trip["step"]),
        resume_step=int(plan.get("targetStep") or 0),
        anomalous_step_at=float(before[onset]),
        trip_at=_at(trip["trippedAt"]),
        detected_at=detected_at,
        stopped_at=stopped[0],
        planned_at=planned[0],
        relaunched_at=relaunched_at,
        first_resumed_step_at=float(resumed[0]["time"]) if resumed else None,
        confirmed_at=confirmed_at,
        restarted_in_place=kept,
        replaced=new,
        start=StartStages.of(logs, from_attempt + 1, nodes),
    )


def format_timeline(timeline: RollbackTimeline) -> str:
    lines = [f"{'':2}{'event':<22}{'t (s)':>8}  detail"]
    for what, at, detail in timeline.rows():
        shown = f"{at:8.2f}" if at is not None else f"{'-':>8}"
        lines.append(f"  {what:<22}{shown}  {detail}")
    relaunch = timeline.since_detection(timeline.relaunched_at)
    resumed = timeline.since_detection(timeline.first_resumed_step_at)
    lines.append(
        f"  detection -> pods relaunched {relaunch:.2f} s; detection -> first resumed step "
        f"{resumed:.2f} s; steps lost {timeline.steps_lost}"
        if relaunch is not None and resumed is not None
        else "  the relaunch was not observed completely"
    )
    return "\n".join(lines)
