"""Every fault the project claims to heal, injected now into a running tiny-GPT job.

The chaos harness (bench/chaos.py) decides when; this module does it, on the local cluster
(support.localnode) the job runs on, and checks on the spot that it happened:

- "kill": SIGKILL of one rank's training process (a torchrun worker in the rank's pod),
  found in the process table by the pod's marker and the worker's RANK; gone before return.
- "nan", "hang", "spike": a trigger file in the job's fault directory on the PFS claim,
  which train.py reads every step (examples/tiny-gpt/triggers.py). The named rank claims it
  with a marker and fires once in the whole run, in whichever attempt sees it first:
  `fired()` reads the marker (step, attempt, time, the poisoned shard). A trigger written
  while no pod runs fires at the next attempt's first step. A spike poisons the next shard
  the data starts, so it shows about one shard later (16 steps at 2 x 8 per step), and only
  trips the default detection past its warm-up (baseline.warmupSteps, 100 steps).
- "lost-node": a node running one of the job's pods is lost (heartbeats stop, its pods'
  processes die) and comes back after `lost_node_seconds` (tick), so the pool refills.
  Keep it above ~15 s (the control plane's 10 s grace, then the workers' unreachable
  toleration of 0 s and the taint pass): the returning node finalizes the pods the eviction
  marked for deletion, not others.
- "pfs-readonly": the PFS claim read-only in every container of every pod that mounts it
  (a stacked read-only bind mount in each container's mount namespace, and read-only for
  containers that start meanwhile) for `pfs_seconds`; tick makes it writable again.
- "operator-kill": SIGKILL of the operator process, then started again after
  `operator_down_seconds`.
- "corrupt-checkpoint": one data file of the newest committed checkpoint copy on one tier
  (a node's local copy or the PFS part of one node) has bytes flipped in place, same size,
  so the size-only inventory scan still lists it and only the deep (crc32) verify that
  restore and replication run rejects it; checked here with the agent's own verify_copy.
- "apiserver-restart": kube-apiserver stopped and started again (etcd keeps the data);
  returns once /readyz answers and kubectl lists the job again.

Processes (the operator, kube-apiserver) restarted here die with the thread that started
them (support.processes): call inject/tick/close from the harness's main thread.

Beware, for a schedule: two attempts in a row that end with the same error are a crash loop
(operator policy/crashloop.py), and the default `recovery.crashLoop.action: Fail` fails the
job; two "kill"s with no other fault between them end two attempts with "killed by signal 9".
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from stabletrain_agent.checkpoint.layout import MANIFEST_NAME, TEMP_PREFIX
from stabletrain_agent.checkpoint.manifest import CheckpointCorruptError, verify_copy
from stabletrain_operator import naming
from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION
from stabletrain_operator.naming import ATTEMPT_LABEL, job_selector
from support.controlplane import ControlPlane
from support.localnode import LocalCluster
from support.operator import OperatorProcess, checkpoint_key

KINDS: tuple[str, ...] = (
    "kill",
    "nan",
    "hang",
    "spike",
    "lost-node",
    "pfs-readonly",
    "operator-kill",
    "corrupt-checkpoint",
    "apiserver-restart",
)
"""The kinds shown to take effect (tests/e2e/test_fault_injection.py); inject refuses others."""
FAULT_SUBDIR = "tiny-gpt-faults"
"""train.py's default trigger directory under the PFS tier (train.FAULT_SUBDIR)."""
TRIGGER_KINDS = ("nan", "hang", "spike")
NAN_STEPS = 3
"""The default detection's nonFinite.consecutiveSteps: a shorter burst is only skipped."""
GONE_SECONDS = 10.0
Json = dict[str, Any]


class InjectionError(RuntimeError):
    """The fault could not be injected now (nothing to hit, or it did not take); the
    message says why. Nothing was changed, so the harness may try again later."""


@dataclass(frozen=True)
class Injected:
    """One fault as it was applied."""

    kind: str
    at: float
    """time.time() when it was applied."""
    target: str
    """What was hit: "rank 1", "node node-b", "pfs claim t-x/pfs", a file path..."""
    detail: str
    """One line: how, and what was seen to take effect."""
    until: float | None = None
    """time.time() when a timed fault ends (tick ends it), else None."""
    ref: str = ""
    """The trigger id of an in-trainer fault, for fired()."""


@dataclass
class _Pending:
    injected: Injected
    undo: Callable[[], None] = field(repr=False)


def write_trigger(directory: Path, trigger_id: str, body: Json) -> Path:
    """A trigger as train.py's TriggerBox reads it: written aside, renamed into place, so a
    rank never reads half of one."""
    directory.mkdir(parents=True, exist_ok=True)
    temp = directory / f".{trigger_id}.tmp"
    temp.write_text(json.dumps(body))
    final = directory / f"{trigger_id}.json"
    temp.rename(final)
    return final


def read_marker(directory: Path, trigger_id: str) -> Json | None:
    """The marker the acting rank left (kind, rank, step, attempt, time, shard, steps)."""
    path = directory / f"{trigger_id}.fired"
    with contextlib.suppress(OSError, ValueError):
        found: Json = json.loads(path.read_text())
        return found
    return None


def _environ(pid: int) -> dict[str, str]:
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
    return {}


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def training_processes(cluster: LocalCluster, namespace: str, pod: str) -> dict[int, int]:
    """Global rank -> pid of each training process (a torchrun worker of train.py) of the
    pod, found by the pod's marker and the worker's own RANK and LOCAL_RANK."""
    found = {}
    for pid in cluster.pod_processes(namespace, pod):
        environ = _environ(pid)
        if "LOCAL_RANK" in environ and "RANK" in environ and "train.py" in _cmdline(pid):
            found[int(environ["RANK"])] = pid
    return found


def flip_bytes(path: Path, rng: random.Random, count: int = 16) -> int:
    """Inverts `count` bytes in the middle part of the file, in place (the size stays);
    returns the offset of the first."""
    size = path.stat().st_size
    if size == 0:
        raise InjectionError(f"{path} is empty; nothing to corrupt")
    count = min(count, size)
    offset = rng.randrange(size // 4, max(size // 4 + 1, size * 3 // 4 - count + 1))
    with path.open("r+b") as handle:
        handle.seek(offset)
        data = handle.read(count)
        handle.seek(offset)
        handle.write(bytes(b ^ 0xFF for b in data))
        handle.flush()
        os.fsync(handle.fileno())
    return offset


class Injector:
    """Injects the faults of KINDS into one tiny-GPT job and undoes the timed ones.

    `pfs_dir` is the job's PFS claim as this host sees it (`cluster.shared_dir / namespace /
    claim`); the trigger directory is train.py's default under it unless `fault_dir` names
    another (the job must then set TINYGPT_FAULT_DIR to the same place as its pods see it).
    """

    def __init__(
        self,
        *,
        plane: ControlPlane,
        cluster: LocalCluster,
        operator: OperatorProcess,
        api_client: client.ApiClient,
        namespace: str,
        job: str,
        pfs_dir: Path,
        fault_dir: Path | None = None,
        pfs_seconds: float = 60.0,
        lost_node_seconds: float = 60.0,
        operator_down_seconds: float = 2.0,
        apiserver_down_seconds: float = 2.0,
        nan_steps: int = NAN_STEPS,
    ) -> None:
        self.plane = plane
        self.cluster = cluster
        self.operator = operator
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.job = job
        self.pfs_dir = pfs_dir
        self.fault_dir = fault_dir or pfs_dir / FAULT_SUBDIR
        self.pfs_seconds = pfs_seconds
        self.lost_node_seconds = lost_node_seconds
        self.operator_down_seconds = operator_down_seconds
        self.apiserver_down_seconds = apiserver_down_seconds
        self.nan_steps = nan_steps
        self._pending: list[_Pending] = []

    # -- the interface the harness uses --------------------------------------------------
    def inject(self, kind: str, rng: random.Random) -> Injected:
        """Applies one fault of `kind` now; `rng` picks the rank, node, tier or file."""
        actions = {
            "kill": self._kill, "nan": self._trigger, "hang": self._trigger,
            "spike": self._trigger, "lost-node": self._lose_node,
            "pfs-readonly": self._pfs_read_only, "operator-kill": self._kill_operator,
            "corrupt-checkpoint": self._corrupt_checkpoint,
            "apiserver-restart": self._restart_apiserver,
        }  # fmt: skip
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {list(KINDS)}")
        injected: Injected = actions[kind](kind, rng)
        return injected

    def tick(self) -> list[Injected]:
        """Ends the timed faults whose time is up; returns what it ended."""
        now = time.time()
        due = [p for p in self._pending if p.injected.until is not None and p.injected.until <= now]
        for pending in due:
            self._end(pending)
        return [p.injected for p in due]

    def close(self) -> None:
        """Ends every timed fault still going (the PFS writable, lost nodes back)."""
        errors = []
        for pending in list(self._pending):
            try:
                self._end(pending)
            except Exception as error:  # end the others too, then report
                errors.append(f"{pending.injected.kind} {pending.injected.target}: {error}")
        if errors:
            raise RuntimeError("could not end every timed fault: " + "; ".join(errors))

    def pending(self) -> list[Injected]:
        return [p.injected for p in self._pending]

    def fired(self, injected: Injected) -> Json | None:
        """Where an in-trainer fault really struck (its marker), None until it has."""
        if injected.kind not in TRIGGER_KINDS:
            raise ValueError(f"{injected.kind} is not an in-trainer fault")
        return read_marker(self.fault_dir, injected.ref)

    def _end(self, pending: _Pending) -> None:
        pending.undo()
        self._pending.remove(pending)

    # -- reading the job -----------------------------------------------------------------
    def _spec(self) -> Json:
        job: Json = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.job
        )
        spec: Json = job["spec"]
        return spec

    def _world_size(self) -> int:
        workers = self._spec()["workers"]
        return int(workers["nodes"]) * int(workers.get("processesPerNode", 1))

    def _running_pods(self) -> list[Json]:
        """The job's pods with a node and no deletion, newest attempt only."""
        selector = job_selector(self.job)
        listed = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        pods = [
            self.core.api_client.sanitize_for_serialization(p)
            for p in listed.items
            if p.spec.node_name and not p.metadata.deletion_timestamp
            and (p.status.phase or "") == "Running"
        ]  # fmt: skip
        if not pods:
            return []
        newest = max(int(p["metadata"]["labels"][ATTEMPT_LABEL]) for p in pods)
        return [p for p in pods if int(p["metadata"]["labels"][ATTEMPT_LABEL]) == newest]

    def _rank_processes(self) -> dict[int, tuple[Json, int]]:
        """Global rank -> (its pod, the pid of its training process)."""
        found: dict[int, tuple[Json, int]] = {}
        for pod in self._running_pods():
            pids = training_processes(self.cluster, self.namespace, pod["metadata"]["name"])
            found.update({rank: (pod, pid) for rank, pid in pids.items()})
        return found

    # -- the faults ----------------------------------------------------------------------
    def _kill(self, kind: str, rng: random.Random) -> Injected:
        ranks = self._rank_processes()
        if not ranks:
            raise InjectionError("no running training process of the job to kill")
        rank = rng.choice(sorted(ranks))
        pod, pid = ranks[rank]
        at = time.time()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + GONE_SECONDS
        while Path(f"/proc/{pid}").exists() and _environ(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        alive = Path(f"/proc/{pid}").exists() and bool(_environ(pid))
        if alive:
            raise InjectionError(f"pid {pid} of rank {rank} (pod {name}) outlived SIGKILL")
        return Injected(
            kind,
            at,
            f"rank {rank}",
            f"SIGKILL to pid {pid}, the training process of pod {name} on {node}",
        )

    def _trigger(self, kind: str, rng: random.Random) -> Injected:
        rank = rng.randrange(self._world_size())
        trigger_id = f"{int(time.time() * 1000):013d}-{kind}-{uuid.uuid4().hex[:6]}"
        body: Json = {"kind": kind, "rank": rank}
        if kind == "nan":
            body["steps"] = self.nan_steps
        at = time.time()
        path = write_trigger(self.fault_dir, trigger_id, body)
        what = {"nan": f"a {self.nan_steps}-step NaN burst", "hang": "a hang inside a step",
                "spike": "the next shard read poisoned"}[kind]  # fmt: skip
        return Injected(kind, at, f"rank {rank}", f"trigger {path} asks for {what}", ref=trigger_id)

    def _lose_node(self, kind: str, rng: random.Random) -> Injected:
        nodes = sorted({p["spec"]["nodeName"] for p in self._running_pods()})
        nodes = [n for n in nodes if n in self.cluster.node_names]
        if not nodes:
            raise InjectionError("no node runs a pod of the job")
        node = rng.choice(nodes)
        at = time.time()
        self.cluster.lose_node(node)
        until = at + self.lost_node_seconds
        injected = Injected(
            kind,
            at,
            f"node {node}",
            f"heartbeats stopped, its pods' processes killed; back after "
            f"{self.lost_node_seconds:g} s",
            until,
        )

        def bring_back() -> None:
            left = self.cluster.restore_node(node)
            if left:
                print(f"chaos: node {node} back; pods it lost and nobody deleted: {left}")

        self._pending.append(_Pending(injected, bring_back))
        return injected

    def _pfs_read_only(self, kind: str, rng: random.Random) -> Injected:
        claim = self._spec()["checkpoints"]["pfs"]["claimName"]
        at = time.time()
        changed = self.cluster.set_claim_read_only(self.namespace, claim, True)
        until = at + self.pfs_seconds
        injected = Injected(
            kind,
            at,
            f"pfs claim {self.namespace}/{claim}",
            f"read-only for {self.pfs_seconds:g} s in "
            f"{', '.join(changed) or 'no running container'} and any started "
            "meanwhile",
            until,
        )

        def writable() -> None:
            self.cluster.set_claim_read_only(self.namespace, claim, False)

        self._pending.append(_Pending(injected, writable))
        return injected

    def _kill_operator(self, kind: str, rng: random.Random) -> Injected:
        process = self.operator.process
        if process is None or not self.operator.alive():
            raise InjectionError("the operator is not running")
        pid = process.pid
        at = time.time()
        os.kill(pid, signal.SIGKILL)
        if not self.operator.wait_dead(GONE_SECONDS):
            raise InjectionError(f"operator pid {pid} outlived SIGKILL")
        phase = self._phase()
        time.sleep(self.operator_down_seconds)
        self.operator.start()
        assert self.operator.process is not None
        return Injected(
            kind,
            at,
            f"operator pid {pid}",
            f"SIGKILL with the job in phase {phase}; started again after "
            f"{self.operator_down_seconds:g} s as pid {self.operator.process.pid}",
        )

    def _phase(self) -> str:
        with contextlib.suppress(client.ApiException):
            job = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.job
            )
            return str((job.get("status") or {}).get("phase"))
        return "unknown"

    def _corrupt_checkpoint(self, kind: str, rng: random.Random) -> Injected:
        tier = rng.choice(("local", "pfs"))
        copies = self._local_copies() if tier == "local" else self._pfs_copies()
        if not copies:
            raise InjectionError(f"no committed checkpoint copy on the {tier} tier yet")
        newest = max(step for step, _, _ in copies)
        step, attempt, directory = rng.choice([c for c in copies if c[0] == newest])
        files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != MANIFEST_NAME)
        if not files:
            raise InjectionError(f"{directory} holds no data file")
        victim = rng.choice(files)
        at = time.time()
        offset = flip_bytes(victim, rng)
        key = checkpoint_key(self.core, self.namespace, self.job)
        try:
            verify_copy(directory, step=step, attempt=attempt, key=key, deep=True)
        except CheckpointCorruptError as error:
            seen = error.problem
        else:
            raise InjectionError(f"{victim} still verifies after the damage")
        verify_copy(directory, step=step, attempt=attempt, key=key, deep=False)
        return Injected(
            kind,
            at,
            str(victim),
            f"{tier} copy of step {step} (attempt {attempt}): 16 bytes flipped at "
            f"offset {offset}; the size check passes, the deep verify says: {seen}",
        )

    def _local_copies(self) -> list[tuple[int, int, Path]]:
        host_path = self._spec()["checkpoints"]["local"].get("hostPath")
        if not host_path:
            raise InjectionError("the job's local tier is not a hostPath; cannot find its copies")
        found = []
        for node in self.cluster.node_names:
            job_path = naming.local_tier_host_path(host_path, self.namespace, self.job)
            root = self.cluster.host_path(node, job_path)
            found += [
                (step, attempt, directory)
                for part in root.glob("node-*")
                for step, attempt, directory in _committed(part)
            ]
        return found

    def _pfs_copies(self) -> list[tuple[int, int, Path]]:
        return [
            (step, attempt, part)
            for step, attempt, directory in _committed(self.pfs_dir, manifest=False)
            for part in sorted(directory.glob("node-*"))
            if (part / MANIFEST_NAME).is_file()
        ]

    def _restart_apiserver(self, kind: str, rng: random.Random) -> Injected:
        at = time.time()
        seconds = self.plane.restart_apiserver(self.apiserver_down_seconds)
        listed = subprocess.run(
            self.plane.kubectl("get", "stj", self.job, "-n", self.namespace, "-o", "name"),
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if listed.returncode != 0:
            raise InjectionError(f"kubectl after the restart failed: {listed.stderr.strip()}")
        return Injected(
            kind,
            at,
            "kube-apiserver",
            f"stopped, down {self.apiserver_down_seconds:g} s, ready again after "
            f"{seconds:.1f} s; kubectl sees {listed.stdout.strip()}",
        )


def _committed(root: Path, manifest: bool = True) -> list[tuple[int, int, Path]]:
    """(step, attempt, directory) of every step-N/attempt-A under `root` not in progress;
    with `manifest`, only those whose manifest is written (committed)."""
    found = []
    for step_dir in root.glob("step-*"):
        for attempt_dir in step_dir.glob("attempt-*"):
            if attempt_dir.name.startswith(TEMP_PREFIX) or step_dir.name.startswith("."):
                continue
            if manifest and not (attempt_dir / MANIFEST_NAME).is_file():
                continue
            step = int(step_dir.name.split("-")[1])
            attempt = int(attempt_dir.name.split("-")[1])
            found.append((step, attempt, attempt_dir))
    return found


__all__ = [
    "KINDS",
    "Injected",
    "InjectionError",
    "Injector",
    "read_marker",
    "training_processes",
    "write_trigger",
]
