"""Laying each incident at the right fault's door, and what each fault cost, from
step logs and phase times written here by hand."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from support.chaos.inject import Injected
from support.chaos.measure import (
    LIVE_WINDOW_S,
    Incident,
    incidents,
    measure_faults,
    summarize,
    unattributed,
)
from support.chaos.report import unattributed_lines
from support.chaos.run import Applied, RunResult
from support.chaos.schedule import explicit_schedule
from support.tinygpt import StepLogs

T0 = 1_000_000.0


def write_attempt(
    logs: StepLogs, attempt: int, steps: range, restored: int | None, *,
    source: str | None = None, at: float = T0,
) -> None:  # fmt: skip
    logs.directory.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        lines: list[dict[str, Any]] = [
            {"event": "start", "attempt": attempt, "restored_step": restored,
             "restored_from": source, "time": at},
        ]  # fmt: skip
        lines += [
            {"attempt": attempt, "step": s, "loss": 3.0 - s / 1000,
             "time": at + 0.1 * (s - steps[0])}
            for s in steps
        ]  # fmt: skip
        path = logs.directory / f"attempt-{attempt}-rank-{rank}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def restart(restored: int, source: str = "pfs") -> Incident:
    start = {"event": "start", "restored_step": restored, "restored_from": source}
    return Incident(
        entry={"action": "RestartFromLatest", "attempt": 1, "signal": "WorkerFailure",
               "toStep": restored},
        stopping_at=T0 + 10.5, planning_at=T0 + 11.5, relaunching_at=T0 + 12.0,
        pods_running_at=T0 + 14.0, first_step_at=T0 + 16.0, reached_step=100,
        restored_step=restored, restores={0: start, 1: start},
    )  # fmt: skip


def a_run(tmp_path: Path) -> RunResult:
    logs = StepLogs(tmp_path, "ns", claim="pfs/chaos")
    write_attempt(logs, 0, range(1, 101), None, at=T0 + 0.1)
    write_attempt(logs, 1, range(51, 201), 50, source="pfs", at=T0 + 16.0)
    return RunResult("chaos", T0, {"phase": "Succeeded"}, logs)


def test_a_kill_owns_the_restart_an_operator_kill_during_it_and_a_read_only_pfs_do_not(
    tmp_path: Path,
) -> None:
    plan = explicit_schedule([("pfs-readonly", 5), ("kill", 10), ("operator-kill", "recovering")])
    applied = [
        Applied(plan[0], Injected("pfs-readonly", T0 + 5.0, "pfs claim ns/pfs", "", T0 + 65.0),
                phase="Running"),
        Applied(plan[1], Injected("kill", T0 + 10.0, "rank 1", ""), phase="Running"),
        Applied(plan[2], Injected("operator-kill", T0 + 10.8, "operator pid 1", ""),
                phase="Stopping"),
    ]  # fmt: skip
    results = measure_faults(applied, a_run(tmp_path), [restart(50)], pace=0.1)
    pfs, kill, operator = results
    assert (kill.action, kill.matched, kill.steps_lost) == ("RestartFromLatest", True, 50)
    assert kill.detect_s is not None
    assert round(kill.detect_s, 2) == 0.5
    assert (kill.stop_s, kill.relaunch_s, kill.start_s, kill.first_step_s) == (1.0, 2.5, 2.0, 6.0)
    assert kill.lost_s is not None
    assert round(kill.lost_s, 2) == 5.0
    assert (operator.action, operator.matched) == ("", True)
    assert "mid-recovery (Stopping)" in operator.note
    assert (pfs.action, pfs.matched, pfs.note) == ("", True, "ridden through, no restart")
    assert pfs.pause_s is not None
    assert pfs.pause_s < 0.5, "the kill's 6 s gap is the kill's, not the read-only PFS's"


def live(at: float, action: str = "Alert", signal: str = "ThroughputDrop") -> Incident:
    """A decision the pods carried out while training (nothing stopped), decided at `at`."""
    entry = {"action": action, "attempt": 1, "signal": signal, "fromStep": 180,
             "time": datetime.fromtimestamp(at, UTC).isoformat()}  # fmt: skip
    return Incident(entry, None, None, None, None, None, None, None, decided_at=at)


def read_only_pfs() -> list[Applied]:
    """The PFS read-only from T0 + 5 s to T0 + 65 s."""
    (planned,) = explicit_schedule([("pfs-readonly", 5)])
    injected = Injected("pfs-readonly", T0 + 5.0, "pfs claim ns/pfs", "", T0 + 65.0)
    return [Applied(planned, injected, phase="Running")]


def test_a_throughput_alert_long_after_a_read_only_pfs_is_attributed_to_no_fault(
    tmp_path: Path,
) -> None:
    """The last make chaos run pinned such an Alert on the PFS outage (ok NO)."""
    run = a_run(tmp_path)
    alert = live(T0 + 65.0 + 300.0)
    (pfs,) = measure_faults(read_only_pfs(), run, [alert], pace=0.1)
    assert (pfs.action, pfs.matched, pfs.note) == ("", True, "ridden through, no restart")
    assert unattributed(read_only_pfs(), run, [alert]) == [alert]
    lines = unattributed_lines([alert], clock=T0)
    assert "attributed to no fault" in lines[0]
    assert lines[1:] == ["  Alert on ThroughputDrop at step 180 (365.0 s)"]
    assert unattributed_lines([], clock=T0) == ["decisions attributed to no fault: none"]


def test_an_alert_within_the_window_after_a_quiet_fault_ended_is_its_matching_action(
    tmp_path: Path,
) -> None:
    run = a_run(tmp_path)
    inside = live(T0 + 65.0 + LIVE_WINDOW_S - 1.0)
    (pfs,) = measure_faults(read_only_pfs(), run, [inside], pace=0.1)
    assert (pfs.action, pfs.matched) == ("Alert", True), pfs.note
    assert pfs.detect_s == 65.0 + LIVE_WINDOW_S - 1.0 - 5.0
    assert "ThroughputDrop at step 180, live" in pfs.note
    assert unattributed(read_only_pfs(), run, [inside]) == []
    past = live(T0 + 65.0 + LIVE_WINDOW_S + 1.0)
    assert unattributed(read_only_pfs(), run, [past]) == [past]
    before = live(T0 + 4.0)
    assert unattributed(read_only_pfs(), run, [before]) == [before], "before it struck"


def test_a_reduce_lr_is_not_a_quiet_faults_action_and_a_live_decision_never_takes_a_restart(
    tmp_path: Path,
) -> None:
    run = a_run(tmp_path)
    (pfs,) = measure_faults(read_only_pfs(), run, [live(T0 + 30.0, "ReduceLR", "LossSpike")], 0.1)
    assert (pfs.action, pfs.matched) == ("ReduceLR", False)
    plan = explicit_schedule([("kill", 10)])
    kill = [Applied(plan[0], Injected("kill", T0 + 10.0, "rank 1", ""), phase="Running")]
    alert = live(T0 + 20.0)
    (result,) = measure_faults(kill, run, [restart(50), alert], pace=0.1)
    assert (result.action, result.matched) == ("RestartFromLatest", True)
    assert "also Alert on ThroughputDrop at step 180 (19.9 s)" in result.note, (
        "seconds after the first step"
    )
    assert unattributed(kill, run, [restart(50), alert]) == []


def test_a_restart_with_no_crash_before_it_is_a_mismatch_of_the_quiet_fault(tmp_path: Path) -> None:
    plan = explicit_schedule([("apiserver-restart", 5)])
    applied = [Applied(plan[0], Injected("apiserver-restart", T0 + 5.0, "kube-apiserver", ""),
                       phase="Running")]  # fmt: skip
    (result,) = measure_faults(applied, a_run(tmp_path), [restart(50)], pace=0.1)
    assert (result.expected, result.action, result.matched) == ("", "RestartFromLatest", False)


def test_a_restart_that_restores_the_torn_copy_is_a_mismatch(tmp_path: Path) -> None:
    plan = explicit_schedule([("corrupt-checkpoint", 9), ("kill", "next")])
    torn = "/x/nodes/node-b/host/nvme/chaos/node-1/step-0000000050/attempt-0/__0_0.distcp"
    applied = [
        Applied(plan[0], Injected("corrupt-checkpoint", T0 + 9.0, torn,
                                  "local copy of step 50 (attempt 0): 16 bytes flipped"),
                phase="Running"),
        Applied(plan[1], Injected("kill", T0 + 9.5, "rank 0", ""), phase="Running"),
    ]  # fmt: skip
    run = a_run(tmp_path)
    healthy, _ = measure_faults(applied, run, [restart(50, "pfs")], pace=0.1)
    assert healthy.matched, healthy.note
    assert "did not use the torn local copy of step 50" in healthy.note
    picked, _ = measure_faults(applied, run, [restart(50, "local")], pace=0.1)
    assert not picked.matched
    assert "restored the torn local copy of step 50" in picked.note


def test_ettr_is_the_clean_time_over_the_chaos_time_and_the_final_loss_is_compared(
    tmp_path: Path,
) -> None:
    chaos = a_run(tmp_path / "chaos")
    clean_logs = StepLogs(tmp_path / "clean", "ns", claim="pfs/clean")
    write_attempt(clean_logs, 0, range(1, 201), None, at=T0 + 0.1)
    clean = RunResult("clean", T0, {"phase": "Succeeded"}, clean_logs)
    summary = summarize(clean, chaos, 200, ["Running", "Stopping", "Running", "Succeeded"])
    assert round(summary.clean_seconds, 2) == 20.0
    assert round(summary.chaos_seconds, 2) == 30.9
    assert round(summary.ettr, 3) == round(20.0 / 30.9, 3)
    assert summary.final_ratio == 1.0, "the same losses at the same steps"
    assert summary.human_actions == 0
    failed = RunResult("chaos", T0, {"phase": "Failed"}, chaos.logs)
    assert summarize(clean, failed, 200, ["Running", "Suspended"]).human_actions == 2


def test_a_chaos_run_that_never_finished_counts_the_wall_time_it_took(tmp_path: Path) -> None:
    clean_logs = StepLogs(tmp_path / "clean", "ns", claim="pfs/clean")
    write_attempt(clean_logs, 0, range(1, 201), None, at=T0 + 0.1)
    clean = RunResult("clean", T0, {"phase": "Succeeded"}, clean_logs)
    stuck = a_run(tmp_path / "chaos")
    stuck.status = {"phase": "Confirming"}
    stuck.gave_up_at = T0 + 400.0
    summary = summarize(clean, stuck, 200, ["Running", "Confirming"])
    assert summary.chaos_seconds == 400.0
    assert round(summary.ettr, 3) == 0.05
    assert summary.human_actions == 1, "a job that never finishes waits for a person"


class SeenPhases:
    """What `incidents` reads of a Recorder: the job's phase changes and when pods ran."""

    def __init__(self, phases: list[tuple[float, str, dict[str, Any]]]) -> None:
        self._phases = phases

    def phases(self) -> list[tuple[float, str, dict[str, Any]]]:
        return self._phases

    def pods_running(self, attempt: int, count: int) -> float | None:
        return None


def test_a_restart_planned_again_after_its_restore_failed_is_one_incident_from_the_first_stop(
    tmp_path: Path,
) -> None:
    logs = StepLogs(tmp_path, "ns", claim="pfs/chaos")
    write_attempt(logs, 0, range(1, 507), None, at=T0)
    (logs.directory / "attempt-1-rank-0.jsonl").write_text("")  # its restore of 475 failed
    write_attempt(logs, 2, range(451, 600), 450, source="pfs", at=T0 + 70.0)
    seen = SeenPhases([
        (T0 + 51.0, "Stopping", {"attempt": 0}), (T0 + 53.0, "Relaunching", {"attempt": 0}),
        (T0 + 62.0, "Stopping", {"attempt": 1}), (T0 + 64.0, "Relaunching", {"attempt": 1}),
    ])  # fmt: skip
    entry = {"action": "RestartFromLatest", "attempt": 2, "signal": "WorkerFailure",
             "fromStep": 506, "toStep": 450}  # fmt: skip
    (incident,) = incidents(seen, {"rollbackHistory": [entry]}, logs, nodes=2)
    assert incident.stopping_at == T0 + 51.0, "the incident began with attempt 0's stop"
    assert (incident.reached_step, incident.restored_step, incident.steps_lost) == (506, 450, 56)


def test_a_spike_long_after_an_operator_kill_is_a_stop_of_no_fault(tmp_path: Path) -> None:
    """The long make chaos run laid a spike at step 8657 on an operator kill minutes
    earlier, as a mismatched Rollback."""
    plan = explicit_schedule([("operator-kill", 5)])
    kill = [Applied(plan[0], Injected("operator-kill", T0 + 5.0, "operator pid 1", ""),
                    phase="Running")]  # fmt: skip
    spike = restart(50)
    spike.entry = {**spike.entry, "action": "Rollback", "signal": "LossSpike"}
    for at in ("stopping_at", "planning_at", "relaunching_at", "pods_running_at"):
        setattr(spike, at, getattr(spike, at) + LIVE_WINDOW_S)
    run = a_run(tmp_path)
    (result,) = measure_faults(kill, run, [spike], pace=0.1)
    assert (result.action, result.matched) == ("", True), result.note
    assert unattributed(kill, run, [spike]) == [spike]
    assert "Rollback on LossSpike" in unattributed_lines([spike], clock=T0)[1]


def test_a_rollback_of_a_spikes_poisoned_shard_read_again_is_that_spikes(tmp_path: Path) -> None:
    """make chaos: the spike's shard-0228, skipped for steps 3599-3899, came back on the
    next pass over the data at step 8449, right after a read-only PFS ended; the rollback
    was laid at the PFS outage's door (a Rollback where none was expected)."""
    plan = explicit_schedule([("spike", 5), ("pfs-readonly", 20)])
    spike = Applied(plan[0], Injected("spike", T0 + 5.0, "rank 0", ""), phase="Running",
                    fired={"step": 60, "time": T0 + 5.0, "shard": "shard-0228"})  # fmt: skip
    pfs = Applied(plan[1], Injected("pfs-readonly", T0 + 20.0, "pfs claim", "", T0 + 30.0),
                  phase="Running")  # fmt: skip
    first, again = restart(50), restart(80)
    for incident, at in ((first, 8.0), (again, 35.0)):
        incident.entry = {**incident.entry, "action": "Rollback", "signal": "LossSpike",
                          "skipped": [{"shardIds": ["shard-0228", "shard-0227"]}]}  # fmt: skip
        incident.stopping_at = T0 + at
    run = a_run(tmp_path)
    spiked, outage = measure_faults([spike, pfs], run, [first, again], pace=0.1)
    assert (spiked.action, spiked.matched) == ("Rollback", True)
    assert "also Rollback on LossSpike" in spiked.note
    assert (outage.action, outage.matched) == ("", True), outage.note
