"""The torch side of the agent: one call per step that watches, protects and obeys.

Three lines in a plain PyTorch loop (or under torchrun, with DDP or without; create it
after ``init_process_group``), with the checkpoint manager attached and restored first::

    guard = Guard.from_env(model, optimizer, scheduler=scheduler, data=batches)  # 1
    manager = CheckpointManager(CheckpointConfig.from_env(),
                                {"train": ModelOptimizerState(model, optimizer), "guard": guard},
                                {"scheduler": scheduler})
    guard.checkpoints = manager
    restore_planned(manager, guard.applied, termination_path=guard.env.termination_path)
    try:
        while guard.global_step < total_steps:
            inputs, targets = next(batches)
            loss = model(inputs, targets)
            loss.backward()
            verdict = guard.step(loss, tokens=inputs.numel())  # 2: clip, optimizer.step, ...
            optimizer.zero_grad()
            if guard.is_save_step():  # 3: every checkpoints.intervalSteps; inside an anomaly
                manager.save(guard.global_step, stable=not verdict.findings,  # the save is
                             spike_marker=bool(verdict.findings))  # evidence
        manager.wait()
        manager.flush(60.0)
    finally:
        guard.close()  # the final step for the operator, or the hand-over after an error
    manager.close()

``Guard.from_env`` reads the pod's directives and paths and, on local rank 0, serves
/metrics, /v1/status and the live-directive PUT; ``Guard(...)`` takes each part explicitly.

``guard.step`` clips and measures the grad norm in one pass, agrees with the other ranks
through one all-reduce and one host read (see consensus.py), asks the torch-free monitor
for a verdict, and only then lets the optimizer step: a non-finite loss or gradient never
reaches the weights. It applies the directives' LR scale and re-warm-up so the user's
scheduler never sees them (see lr.py), records which data the step consumed, adopts newer
directives on every rank at the same step, and on a trip stops every rank at the same
step, leaves the trip report for the operator and exits non-zero. With the checkpoint
manager attached it also keeps every healthy step the job's memory interval names in the
pod's memory tier (``CheckpointManager.snapshot``): the loop's own saves stay as they are.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.amp.grad_scaler import GradScaler
from torch.optim.lr_scheduler import LRScheduler

from stabletrain_agent.consensus import Agreed, agree
from stabletrain_agent.data import skip_list_from_directives
from stabletrain_agent.data.source import BatchSource
from stabletrain_agent.endpoint.directive_inbox import DirectiveSource
from stabletrain_agent.endpoint.exporter import AgentExporter
from stabletrain_agent.gather_preflight import finish_preflight, gather_facts, preflight_requested
from stabletrain_agent.lineage import LineageRing, lineage_dir, suspect_shards, write_window
from stabletrain_agent.lr import LrScale
from stabletrain_agent.run_end.trip_exit import TrainingTripped, write_termination_message
from stabletrain_agent.run_end.write_completion import leave_completion
from stabletrain_contract import env
from stabletrain_contract.channel import RejectedCopy
from stabletrain_contract.checkpoint.inventory import CheckpointRecord, compact_inventory
from stabletrain_contract.checkpoint.settings import CheckpointSettings
from stabletrain_contract.completion import Completion
from stabletrain_contract.detection import DetectionConfig
from stabletrain_contract.directives import DEFAULT_TRIP_ON, Directives, parse_directives
from stabletrain_contract.names import custom_signal
from stabletrain_contract.preflight import PreflightFacts
from stabletrain_contract.signals.monitor import SignalMonitor, StepObservation, Verdict
from stabletrain_contract.signals.monitored import MonitoredSignal
from stabletrain_contract.signals.trip_report_builder import build_trip_report

STATE_VERSION = 1
CHECKPOINT_FLUSH_SECONDS = 60.0
"""How long a trip waits for in-flight checkpoint saves before the process exits."""
SAVE_REQUEST_FLUSH_SECONDS = 60.0
"""How long a requested save (before a suspend) may take to reach the PFS; the operator
stops the pods after SUSPEND_SAVE_SECONDS whatever happens, which is longer."""


class DirectiveFeed(Protocol):
    """Where the newest directives known to this process come from; never blocks."""

    def latest(self) -> Directives | None: ...


class PfsState(Protocol):
    """Whether the PFS took the last write (checkpoint.replicate.PfsCondition)."""

    available: bool
    message: str


INVENTORY_REFRESH_WAIT_SECONDS = 1.0
"""How long a status request waits for a fresh scan while a local copy waits for the PFS:
the operator's scrape timeout is 2 s, and a hung PFS must not silence the pod."""
HAND_OVER_SECONDS = 10.0
"""How long training that ends on an error keeps the process for its copies on their way to
the PFS and for one scrape of the result (the operator scrapes that long, too)."""


class Checkpoints(Protocol):
    """What the guard needs from the checkpoint manager (checkpoint.CheckpointManager)."""

    def inventory(self) -> Sequence[CheckpointRecord]: ...

    def rejected(self) -> Sequence[RejectedCopy]:
        """Copies the manager refused (not the job's, damaged), for the status."""
        ...

    def is_save_step(self, step: int) -> bool:
        """Whether the job saves after `step` (spec.checkpoints.intervalSteps)."""
        ...

    def apply_settings(self, settings: CheckpointSettings) -> None:
        """Save and keep what the adopted directives say (an edited spec, live)."""
        ...

    def save(
        self,
        step: int,
        *,
        stable: bool,
        spike_marker: bool = False,
        anomalies: Sequence[str] = (),
        baseline: Mapping[str, float] | None = None,
    ) -> object: ...

    def snapshot(self, step: int, *, stable: bool) -> bool:
        """Keep the state after `step` in the pod's memory tier when `step` is a snapshot
        step (spec.checkpoints.memory.intervalSteps); whether one was started."""
        ...

    def wait(self) -> None: ...

    def flush(self, deadline_s: float, before_step: int | None = None) -> object: ...

    @property
    def inventory_version(self) -> int:
        """Changes whenever the inventory may have; reading it costs no I/O."""
        ...

    @property
    def pfs_condition(self) -> PfsState: ...

    @property
    def replicating(self) -> tuple[int, ...] | None:
        """Steps of this node's copies still to be written to the PFS (None: no PFS)."""
        ...

    @property
    def restored_at(self) -> datetime | None:
        """When the restore finished (None before it): the start-up stall bound's origin."""
        ...


@dataclass(frozen=True)
class GuardEnv:
    """What the pod's environment tells the guard (names from the contract)."""

    attempt: int = 0
    node: str = "localhost"
    pod: str = "localhost"
    local_rank: int = 0
    termination_path: Path | None = None
    lineage_root: Path | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> GuardEnv:
        source = os.environ if environ is None else environ
        termination = source.get(env.TERMINATION_MESSAGE_PATH)
        lineage = source.get(env.LINEAGE_DIR)
        return cls(
            attempt=int(source.get(env.ATTEMPT, "0")),
            node=source.get(env.NODE_NAME) or socket.gethostname(),
            pod=source.get(env.POD_NAME) or socket.gethostname(),
            local_rank=int(source.get(env.LOCAL_RANK, "0")),
            termination_path=Path(termination) if termination else None,
            lineage_root=Path(lineage) if lineage else None,
        )


class Guard:
    """Per-step signals, NaN protection, LR directives, lineage and trips for one rank."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        scheduler: LRScheduler | None = None,
        scaler: GradScaler | None = None,
        max_grad_norm: float | None = 1.0,
        data: BatchSource | None = None,
        directives: DirectiveFeed | None = None,
        exporter: AgentExporter | None = None,
        checkpoints: Checkpoints | None = None,
        saving: Callable[[], bool] | None = None,
        lineage_window: int = 512,
        process_group: dist.ProcessGroup | None = None,
        guard_env: GuardEnv | None = None,
        detectors: Sequence[MonitoredSignal] = (),
    ) -> None:
        """`detectors`: the loop's own signals beside the built-in ones (see SignalMonitor);
        they fire `custom:<name>` for entries of the spec's `detection.custom`."""
        if max_grad_norm is not None and not max_grad_norm > 0.0:
            raise ValueError(f"max_grad_norm must be positive or None, got {max_grad_norm!r}")
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.max_grad_norm = max_grad_norm
        self.data = data
        self.env = guard_env or GuardEnv.from_environ()
        self._parameters = [p for p in model.parameters() if p.requires_grad]
        self._feed = directives if directives is not None else DirectiveSource.from_env()
        self.exporter = exporter
        if exporter is not None:
            exporter.before_status = self._refresh_for_status
        self._saving = saving
        self.applied: Directives | None = None
        self._checkpoints: Checkpoints | None = None
        self.checkpoints = checkpoints
        self._exported_version: int | None = None
        self._inventory_export: threading.Thread | None = None
        self._export_lock = threading.Lock()
        self._awaiting_pfs = False
        """The last scan listed a local copy not complete on the PFS yet."""
        self._group = process_group
        self._distributed = dist.is_available() and dist.is_initialized()
        """Whether the step's reduction and the collectives that follow it (adopting the
        newest directives, the suspect shards of a trip) run across the group: settled
        when the guard is made, as its rank is, so they all go by one answer (asking
        torch each step also cost ~5 us inside a framework's fit)."""
        self.rank = dist.get_rank(process_group) if self._distributed else 0
        self.lr = LrScale()
        self.lineage = LineageRing(lineage_window)
        self.global_step = 0
        """Optimizer steps finished (skipped ones included): the step the next one follows."""
        self.skipped_steps = 0
        self.saved_request = 0
        """The newest directives save_request answered (a pod starts with its ConfigMap's)."""
        self._steps_since_start = 0
        self._lineage_written: set[int] = set()
        self._last_step_end = time.perf_counter()
        self.monitor = SignalMonitor(DetectionConfig(), DEFAULT_TRIP_ON, detectors=detectors)
        self._observed: dict[str, torch.Tensor | float] = {}
        initial = self._feed.latest()
        if initial is not None:
            self._adopt(initial, at_start=True)

    @classmethod
    def from_env(
        cls,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        **options: Any,
    ) -> Guard:
        """The guard of a pod the operator started: directives, exporter and paths from env.

        Local rank 0 serves /metrics, /v1/status and the live-directive PUT; the exporter
        stops with ``close()`` or with the process. It also shows the run's preflight facts
        (see gather_preflight.py); ``warmup_steps`` and ``checkpoint_interval_steps`` among the
        options state them where probing the scheduler cannot. In the operator's preflight
        pod (STABLETRAIN_PREFLIGHT=1) this gathers the facts, leaves them as the termination
        message and exits 0: the script never reaches its first step there.
        """
        warmup_steps = options.pop("warmup_steps", None)
        interval = options.pop("checkpoint_interval_steps", None)
        source = DirectiveSource.from_env()
        if preflight_requested():
            guard = cls(model, optimizer, directives=source, **options)
            facts = guard.preflight_facts(
                warmup_steps=warmup_steps, checkpoint_interval_steps=interval
            )
            finish_preflight(
                facts, local_rank=guard.env.local_rank, termination=guard.env.termination_path
            )
        exporter = AgentExporter.from_env(source)
        if exporter is not None:
            exporter.start()
        guard = cls(model, optimizer, directives=source, exporter=exporter, **options)
        if exporter is not None:
            try:
                facts = guard.preflight_facts(
                    warmup_steps=warmup_steps, checkpoint_interval_steps=interval
                )
            except Exception as error:  # the facts are advice; training goes on without them
                print(f"stabletrain: preflight facts not gathered: {error!r}", file=sys.stderr)
            else:
                exporter.set_preflight(facts)
        return guard

    def preflight_facts(
        self, *, warmup_steps: int | None = None, checkpoint_interval_steps: int | None = None
    ) -> PreflightFacts:
        """The run's stability facts from the parts this guard holds (nothing is changed)."""
        return gather_facts(
            self.model,
            self.optimizer,
            scheduler=self.scheduler,
            scaler=self.scaler,
            max_grad_norm=self.max_grad_norm,
            data=self.data,
            warmup_steps=warmup_steps,
            checkpoint_interval_steps=checkpoint_interval_steps,
            world_size=dist.get_world_size(self._group) if self._distributed else 1,
        )

    def observe(self, name: str, value: torch.Tensor | float) -> None:
        """Report a custom scalar (validation loss, MoE aux loss, entropy) with the next step.

        It travels in that step's one all-reduce, averaged over ranks, so every rank must
        observe the same names before the same ``step``; a step without the name leaves
        its detector's streak untouched (a validation loss measured every few hundred steps).
        """
        custom_signal(name)
        self._observed[name] = value

    def close(self) -> None:
        """Stop serving metrics and directives (safe to call more than once).

        Called while an error other than a trip ends training (from the loop's `finally`),
        it first hands the checkpoints over (`_hand_over_checkpoints`); called with no error
        in flight, it leaves the final step and loss for the operator (`_leave_completion`).
        """
        ending = sys.exc_info()[1]
        if isinstance(ending, Exception) and not isinstance(ending, TrainingTripped):
            self._hand_over_checkpoints()
        if ending is None:
            self._leave_completion()
        if self.exporter is not None:
            self.exporter.stop()

    def _leave_completion(self) -> None:
        """The pod's termination message, under the operator (one writer per pod): the
        operator's last scrape may be seconds older than the last step, and it reads the
        final step and loss from here once every pod succeeded."""
        path = self.env.termination_path
        if path is None or self.env.local_rank != 0:
            return
        snapshot = self.monitor.snapshot()
        loss = snapshot.loss if snapshot.step == self.global_step else None
        try:
            leave_completion(path, Completion(self.global_step, self.env.attempt, loss))
        except OSError as error:  # a finished run must not fail over its final numbers
            print(f"stabletrain: final step not left in {path}: {error!r}", file=sys.stderr)

    def _hand_over_checkpoints(self) -> None:
        """Under the operator (directives applied): finish the copies on their way to the
        PFS and scan when the last scan may be out of date, then keep answering until a
        status listing the newest scan was served to the operator (a read presenting the
        status credential; anyone else's read does not count); at most HAND_OVER_SECONDS
        in all.

        A rank killed outright ends the other ranks' collective with an error at once (gloo),
        and without this their agents went with them, their copies still in flight
        abandoned: the operator, told of the kill by the pod watch, found no agent left to
        ask and planned the restart from its previous scrape, which may list the newest
        checkpoint not yet complete on the PFS, or not at all.
        """
        checkpoints, exporter = self.checkpoints, self.exporter
        if checkpoints is None or exporter is None or self.applied is None:
            return
        deadline = time.monotonic() + HAND_OVER_SECONDS
        if self._scan_outdated(checkpoints):
            checkpoints.flush(HAND_OVER_SECONDS)
            self._rescan(deadline)
        exporter.await_inventory_served(max(0.0, deadline - time.monotonic()))

    @property
    def checkpoints(self) -> Checkpoints | None:
        """The checkpoint manager. Its inventory is exported whenever it changes, and with
        the trip report after a flush. Settable after construction (the manager usually
        checkpoints the guard itself, so it is built after it): it then takes the checkpoint
        settings of the directives in force, as it does every time newer ones are adopted."""
        return self._checkpoints

    @checkpoints.setter
    def checkpoints(self, manager: Checkpoints | None) -> None:
        self._checkpoints = manager
        settings = self.applied.checkpoints if self.applied is not None else None
        if manager is not None and settings is not None:
            manager.apply_settings(settings)

    def is_save_step(self) -> bool:
        """Whether the step just finished is one the job saves at, as the attached manager's
        interval (spec.checkpoints.intervalSteps) says: the loop need not repeat it."""
        if self.checkpoints is None:
            raise RuntimeError("is_save_step needs a checkpoint manager: set guard.checkpoints")
        return self.checkpoints.is_save_step(self.global_step)

    @property
    def applied_generation(self) -> int:
        return self.applied.generation if self.applied else 0

    def step(
        self,
        loss: torch.Tensor,
        *,
        tokens: int | None = None,
        custom: Mapping[str, torch.Tensor | float] | None = None,
    ) -> Verdict:
        """Finish one training step; raises TrainingTripped on every rank when it trips.

        Call after ``backward()`` in place of clipping, ``optimizer.step()`` and
        ``scheduler.step()``. With a GradScaler pass the unscaled loss. A step without any
        finding is handed to the attached checkpoints' ``snapshot`` (the memory tier keeps
        it if the step is a snapshot step; staging it is all the step waits for).
        """
        step = self.global_step + 1
        custom = {**self._observed, **(custom or {})}
        self._observed = {}
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = self._clip()
        latest = self._feed.latest()
        now = time.perf_counter()
        agreed = agree(
            loss,
            grad_norm,
            step_seconds=now - self._last_step_end,
            tokens=tokens or 0,
            has_newer_directives=latest is not None and latest.generation > self.applied_generation,
            saving=self._saving() if self._saving else False,
            custom=custom,
            group=self._group,
            distributed=self._distributed,
        )
        factor = self.lr.factor(step)
        observation = self._observation(step, agreed, factor, tokens is not None)
        verdict = self.monitor.observe(observation)
        finite = math.isfinite(agreed.loss) and math.isfinite(agreed.grad_norm)
        if finite and not verdict.skip_update and not verdict.trip:
            with self.lr.applied(self.optimizer, step):
                self.optimizer.step()
        else:
            self.skipped_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()
        self.global_step = step
        self._steps_since_start += 1
        if self.data is not None and self.data.last_lineage is not None:
            self.lineage.record(step, self.data.last_lineage)
        if self.exporter is not None and not verdict.trip:  # a trip publishes with its report
            self._publish_step(self.exporter)
            self._export_checkpoints_if_changed()
        self._write_sustained_lineage(verdict)
        if agreed.ranks_with_newer_directives:
            self._adopt_newest(latest)
            self._save_if_requested(verdict)
        if self.checkpoints is not None and not verdict.findings:
            # Every rank agreed on the verdict, so every rank makes the same call.
            self.checkpoints.snapshot(step, stable=True)
        if verdict.trip:
            self._trip(verdict)
        self._last_step_end = time.perf_counter()
        return verdict

    def _publish_step(self, exporter: AgentExporter) -> None:
        """Show this step in the status endpoint and the metrics."""
        exporter.update(
            self.monitor.snapshot(),
            lr_scale=self.lr.scale,
            applied_generation=self.applied_generation,
        )

    def _export_checkpoints_if_changed(self) -> None:
        """Keep the exporter's inventory current between trips, off the training thread.

        The operator plans a rollback after a crash (no trip report) from its last scrape,
        so the scrape must already list the newest checkpoints.  The version check costs no
        I/O; a scan runs only when the manager committed a save, a copy reached the PFS or
        the PFS condition changed, and in a background thread: the scan verifies parts other
        nodes wrote to the PFS, which would stall the step.
        """
        checkpoints = self.checkpoints
        # The version is read without the lock first: on most steps it has not moved, and
        # then the locked check would start nothing either.
        if checkpoints is not None and checkpoints.inventory_version != self._exported_version:
            self._start_export(force=False)

    def _start_export(self, *, force: bool) -> tuple[threading.Thread | None, bool]:
        """The one scan thread: started when none runs and the version moved (or `force`),
        else the one running; and whether it was started by this call."""
        assert self.checkpoints is not None
        with self._export_lock:
            running = self._inventory_export
            if running is not None and running.is_alive():
                return running, False
            if not force and self.checkpoints.inventory_version == self._exported_version:
                return None, False
            thread = threading.Thread(
                target=self._export_checkpoints, name="stabletrain-inventory", daemon=True
            )
            self._inventory_export = thread
            thread.start()
            return thread, True

    def _refresh_for_status(self) -> None:
        """Before the exporter serves a status: while a copy this node holds is not complete
        on the PFS, or when a save committed or a copy landed since the last scan, scan
        again, so the scrape lists it (complete once the slowest node's copy landed).

        Other nodes' parts reaching the PFS move no version here, and the training thread,
        which scans after its steps, may step no more: blocked in a collective for good (a
        peer just died, NCCL) or ending on its error (gloo, `_hand_over_checkpoints`). The
        operator plans that restart from this very scrape. Waits at most
        INVENTORY_REFRESH_WAIT_SECONDS.

        Also tells the heartbeat when the manager's restore finished: the operator's
        start-up stall bound counts from then, never through the restore.
        """
        if self.checkpoints is None:
            return
        restored_at = self.checkpoints.restored_at
        if restored_at is not None and self.exporter is not None:
            self.exporter.began_training(restored_at)
        if self._scan_outdated(self.checkpoints):
            self._rescan(time.monotonic() + INVENTORY_REFRESH_WAIT_SECONDS)

    def _scan_outdated(self, checkpoints: Checkpoints) -> bool:
        """The last scan listed a copy not complete on the PFS, or the inventory moved since
        it began (before the first step's scan: neither, as before)."""
        exported = self._exported_version
        return self._awaiting_pfs or (
            exported is not None and checkpoints.inventory_version != exported
        )

    def _rescan(self, deadline: float) -> None:
        """Export a scan begun after this call, waiting for it until `deadline`."""
        for _ in range(2):  # a scan already running may have begun before the copy landed
            thread, started = self._start_export(force=True)
            if thread is None:
                return
            thread.join(max(0.0, deadline - time.monotonic()))
            if started or thread.is_alive():
                return

    def _export_checkpoints(self) -> None:
        checkpoints, exporter = self.checkpoints, self.exporter
        if checkpoints is None or exporter is None:
            return
        self._exported_version = checkpoints.inventory_version
        try:
            records = checkpoints.inventory()
        except Exception as error:  # a disk error must not end training; retried next step
            self._exported_version = None
            print(f"stabletrain: checkpoint inventory not exported: {error!r}", file=sys.stderr)
            return
        condition = checkpoints.pfs_condition
        exporter.set_inventory(records)
        exporter.set_rejected(checkpoints.rejected())
        exporter.set_pfs(condition.available, condition.message, checkpoints.replicating)
        self._awaiting_pfs = any(r.local and not r.pfs.complete for r in records)

    def state_dict(self) -> dict[str, Any]:
        """Everything to resume exactly: step, monitor baselines, data cursor, LR state.

        The variable-length parts travel as JSON strings: torch.distributed.checkpoint
        flattens nested containers into keys and loads by the keys a fresh guard has, so a
        monitor history of another length would not load.
        """
        return {
            "version": STATE_VERSION,
            "global_step": self.global_step,
            "skipped_steps": self.skipped_steps,
            "monitor": json.dumps(self.monitor.state_dict()),
            "lr": json.dumps(self.lr.state_dict()),
            "data": json.dumps(self.data.state_dict() if self.data is not None else None),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint; the directives in force keep their LR, skips and ramp."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"guard state has version {state.get('version')!r}; this agent reads "
                f"version {STATE_VERSION}"
            )
        data = json.loads(state["data"])
        if self.data is not None and data is None:
            raise ValueError("the checkpoint has no data cursor but this guard has a data helper")
        self.global_step = int(state["global_step"])
        self.skipped_steps = int(state["skipped_steps"])
        self.monitor.load_state_dict(json.loads(state["monitor"]))
        self.lr.load_state_dict(json.loads(state["lr"]))
        if self.data is not None:
            self.data.load_state_dict(data)
        self._lineage_written.clear()
        self._steps_since_start = 0
        if self.applied is not None:
            if self.applied.resume_step not in (None, self.global_step):
                raise ValueError(
                    f"directives say resume at step {self.applied.resume_step} but the "
                    f"checkpoint loaded is of step {self.global_step}"
                )
            # The directives are the operator's plan for this attempt, never older than the
            # checkpoint; the skip ranges must be placed from the cursor just restored.
            self._adopt(self.applied, at_start=True)

    def _clip(self) -> torch.Tensor:
        """The total grad norm, from the same pass that clips (no second pass)."""
        if self.max_grad_norm is None:
            grads = [p.grad for p in self._parameters if p.grad is not None]
            return torch.nn.utils.get_total_norm(grads)
        return torch.nn.utils.clip_grad_norm_(self._parameters, self.max_grad_norm)

    def _observation(
        self, step: int, agreed: Agreed, factor: float, has_tokens: bool
    ) -> StepObservation:
        overflow = self.scaler is not None and not math.isfinite(agreed.grad_norm)
        throughput = None
        if has_tokens and agreed.step_seconds > 0.0:
            throughput = agreed.tokens / agreed.step_seconds
        return StepObservation(
            step=step,
            loss=agreed.loss,
            # A GradScaler overflow is the scaler probing its scale, not a numerical fault.
            grad_norm=None if overflow else agreed.grad_norm,
            lr=float(self.optimizer.param_groups[0]["lr"]) * factor,
            tokens_per_second=throughput,
            custom=agreed.custom,
            checkpoint_in_flight=agreed.ranks_saving > 0,
            steps_since_start=self._steps_since_start,
        )

    def _adopt_newest(self, mine: Directives | None) -> None:
        """The rare step when some rank holds newer directives: all adopt the newest."""
        candidates: list[str | None] = [mine.to_json() if mine else None]
        if self._distributed:
            candidates = [None] * dist.get_world_size(self._group)
            dist.all_gather_object(candidates, mine.to_json() if mine else None, self._group)
        known = [parse_directives(c) for c in candidates if c is not None]
        newest = max(known, key=lambda d: d.generation, default=None)
        if newest is not None and newest.generation > self.applied_generation:
            self._adopt(newest, at_start=False)

    def _adopt(self, directives: Directives, *, at_start: bool) -> None:
        """Apply LR scale, ramp and thresholds; skips only at start (they need the cursor)."""
        if directives.attempt != self.env.attempt:
            raise ValueError(
                f"directives are for attempt {directives.attempt} but this pod runs "
                f"attempt {self.env.attempt}"
            )
        self.lr.set_scale(directives.lr_scale)
        if directives.resume_step is not None:
            self.lr.start_rewarmup(directives.resume_step, directives.rewarmup_steps)
        self.monitor.reconfigure(directives.detection, directives.trip_on, directives.trip_rules)
        if directives.checkpoints is not None and self.checkpoints is not None:
            self.checkpoints.apply_settings(directives.checkpoints)
        if at_start:
            self.saved_request = max(self.saved_request, directives.save_request)
        if at_start and self.data is not None:
            self.data.set_skip(
                skip_list_from_directives(
                    directives.skip,
                    resume_step=self.global_step,
                    next_batch_index=self.data.next_batch_index,
                )
            )
        if self.env.local_rank == 0 and directives.generation != self.applied_generation:
            print(
                f"stabletrain: directives generation {directives.generation} of attempt "
                f"{directives.attempt} in force from step {self.global_step + 1}: trip on "
                f"{', '.join(directives.trip_on) or 'nothing'}, LR scale {directives.lr_scale:g}",
                flush=True,
            )
        self.applied = directives

    def _save_if_requested(self, verdict: Verdict) -> None:
        """The operator asked for a checkpoint now (it is about to stop the pods): save this
        step on every rank (all adopted the request at this step) and flush it to the PFS.

        A step inside an anomaly is saved as a spike marker, never as a resume point. The
        answer is reported whatever happens, so the operator need not wait out its bound.
        """
        applied = self.applied
        if applied is None or applied.save_request <= self.saved_request:
            return
        self.saved_request = applied.save_request
        saved: int | None = None
        if self.checkpoints is not None and not verdict.trip:
            anomalous = bool(verdict.findings)
            baseline = self.monitor.snapshot().loss_baseline
            try:
                self.checkpoints.save(
                    self.global_step,
                    stable=not anomalous,
                    spike_marker=anomalous,
                    anomalies=[str(f.signal) for f in verdict.findings],
                    baseline={"loss": baseline} if baseline is not None else {},
                )
                self.checkpoints.wait()
                self.checkpoints.flush(SAVE_REQUEST_FLUSH_SECONDS)
                listed = {(r.step, r.attempt) for r in self.checkpoints.inventory()}
                if (self.global_step, self.env.attempt) in listed:
                    saved = self.global_step  # also when the loop had saved this step
            except Exception as error:  # the run goes on; the operator stops it anyway
                print(f"stabletrain: requested checkpoint not saved: {error!r}", file=sys.stderr)
        if self.exporter is not None:
            self._export_checkpoints()  # the operator resumes from what this lists
            self.exporter.set_saved(applied.save_request, saved)
        if self.env.local_rank == 0:
            where = "no checkpoint" if saved is None else f"checkpoint of step {saved}"
            print(f"stabletrain: save request {applied.save_request}: {where}", flush=True)

    def _write_sustained_lineage(self, verdict: Verdict) -> None:
        for finding in verdict.findings:
            if finding.sustained and finding.onset_step not in self._lineage_written:
                self._lineage_written.add(finding.onset_step)
                self._write_lineage(finding.onset_step)

    def _write_lineage(self, onset_step: int) -> str:
        """The window's lineage on the PFS, for people and tools reading an incident later;
        "" when there is nowhere to write it. A PFS that refuses the write (read-only, full,
        gone) must not end training: the trip report still names the suspect shards, which
        the ranks gather among themselves. Under a read-only PFS this once crashed both ranks
        at a sustained spike, and the restart went back 2,359 steps (make chaos)."""
        if self.env.lineage_root is None:
            return ""
        directory = lineage_dir(self.env.lineage_root, self.env.attempt, onset_step)
        try:
            write_window(directory, self.rank, onset_step, self.lineage.window())
        except OSError as error:
            where = f"step {onset_step} not written to {directory}"
            print(f"stabletrain: lineage of the spike window at {where}: {error}; training goes on",
                  file=sys.stderr, flush=True)  # fmt: skip
            return ""
        return str(directory)

    def _suspect_shards_of_all_ranks(self, onset_step: int) -> tuple[str, ...]:
        """Every rank read other shards; all ranks are here at the same step, so gather."""
        mine = suspect_shards(self.lineage.window(), onset_step)
        gathered: list[list[tuple[int, str]] | None] = [mine]
        if self._distributed:
            gathered = [None] * dist.get_world_size(self._group)
            dist.all_gather_object(gathered, mine, self._group)
        closest: dict[str, int] = {}
        for pairs in gathered:
            for distance, shard in pairs or ():
                closest[shard] = min(distance, closest.get(shard, distance))
        return tuple(shard for _, shard in sorted((d, s) for s, d in closest.items()))

    def _trip(self, verdict: Verdict) -> None:
        lead = verdict.tripping[0]
        lineage_path = self._write_lineage(lead.onset_step)
        records: Sequence[CheckpointRecord] = ()
        if self._inventory_export is not None:  # it must not overwrite the newer view below
            self._inventory_export.join()
        if self.checkpoints is not None:
            # Copies from before the onset are the rollback targets: get them to the PFS.
            self.checkpoints.flush(CHECKPOINT_FLUSH_SECONDS, lead.onset_step)
            records = self.checkpoints.inventory()
        report = build_trip_report(
            verdict,
            attempt=self.env.attempt,
            node=self.env.node,
            pod=self.env.pod,
            last_good_step=self.monitor.last_good_step,
            inventory=compact_inventory(records, self.env.node, self.env.pod),
            lineage_path=lineage_path,
            suspect_shards=self._suspect_shards_of_all_ranks(lead.onset_step),
            directives_generation=self.applied_generation,
        )
        tripped = TrainingTripped(report)
        if self.exporter is not None:
            self.exporter.set_inventory(records)
            if self.checkpoints is not None:
                condition = self.checkpoints.pfs_condition
                self.exporter.set_pfs(
                    condition.available, condition.message, self.checkpoints.replicating
                )
            self.exporter.record_trip(report)
            # Only now may a scrape see the tripping finding: seen before the report, it
            # would decide without the suspect shards and the flushed inventory it carries.
            self._publish_step(self.exporter)
        if self.env.local_rank == 0:
            if self.env.termination_path is not None:
                write_termination_message(self.env.termination_path, report)
            print(f"stabletrain: {tripped}", file=sys.stderr, flush=True)
        raise tripped
