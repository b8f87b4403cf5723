"""The memory tier in the operator's plan: which pods' memory a choice may use (a restart from
the latest only), the choice itself, and the merged inventory's memory copies (a fresh scan of
a pod replaces what was known of its memory; a replaced pod's memory never counts)."""

from __future__ import annotations

from operator_builders import NODES, T0, agent, record, spec, trip

from stabletrain_contract.channel import AgentStatus
from stabletrain_contract.checkpoint.inventory import (
    CheckpointRecord,
    PodCopy,
    TierCopy,
    compact_inventory,
)
from stabletrain_contract.names import Action
from stabletrain_operator.api.spec import NoCheckpointDecision
from stabletrain_operator.api.status import Plan
from stabletrain_operator.plan.checkpoint import (
    choose_checkpoint,
    step_bound,
    surviving_memory,
)
from stabletrain_operator.plan.merged_inventory import merged_inventory, without_abandoned

PODS = ("job-a1-0", "job-a1-1")


def snapshot(step: int, pods: tuple[str, ...] = PODS, *, attempt: int = 1) -> CheckpointRecord:
    return CheckpointRecord(
        step=step,
        attempt=attempt,
        stable=True,
        saved_at=T0,
        memory=tuple(PodCopy(pod=p, complete=True, verified=True) for p in pods),
    )


def plan(action: Action, onset: int | None = None) -> Plan:
    return Plan(
        action=action,
        rule="infra" if action is Action.RESTART_FROM_LATEST else "spike",
        signal="WorkerFailure" if action is Action.RESTART_FROM_LATEST else "LossSpike",
        onset_step=onset,
        from_step=37,
        started_at=T0,
        from_attempt=1,
        next_attempt=2,
    )


def test_only_a_restart_from_the_latest_uses_the_kept_pods_memory() -> None:
    assert surviving_memory(plan(Action.RESTART_FROM_LATEST), PODS) == PODS
    assert surviving_memory(plan(Action.RESTART_FROM_LATEST), ("job-a1-0", None)) == (
        "job-a1-0",
        None,
    )
    assert surviving_memory(plan(Action.ROLLBACK, onset=35), PODS) == ()
    assert surviving_memory(plan(Action.FAIL), PODS) == ()


def test_a_restart_whose_pods_are_all_kept_resumes_from_their_memory() -> None:
    """A killed rank at step 37: the local tier has 25, both pods' memory 30."""
    records = [record(25, attempt=1), snapshot(30)]
    restart = plan(Action.RESTART_FROM_LATEST)
    choice = choose_checkpoint(
        records,
        step_bound(restart, spec()),
        NODES,
        stable_only=False,
        memory_pods=surviving_memory(restart, PODS),
    )
    assert choice.step == 30
    assert "every rank restores from memory" in choice.reason
    recreated = choose_checkpoint(records, step_bound(restart, spec()), NODES, stable_only=False)
    assert recreated.step == 25, "the default: no pod kept, no memory"
    replaced = choose_checkpoint(
        records,
        None,
        NODES,
        stable_only=False,
        memory_pods=surviving_memory(restart, ("job-a1-0", None)),
    )
    assert replaced.step == 25, "a replaced pod's memory is gone: the PFS copy"


def test_a_rollback_chooses_its_pre_spike_checkpoint_from_local_and_pfs() -> None:
    rollback = plan(Action.ROLLBACK, onset=40)
    records = [record(25, attempt=1), snapshot(30)]
    choice = choose_checkpoint(
        records,
        step_bound(rollback, spec()),
        NODES,
        onset=40,
        when_none=NoCheckpointDecision.NARROW_MARGIN,
        memory_pods=surviving_memory(rollback, PODS),
    )
    assert choice.step == 25


def test_a_memory_step_the_pods_could_not_restore_is_excluded_on_the_re_plan() -> None:
    choice = choose_checkpoint(
        [record(25, attempt=1), snapshot(30)],
        None,
        NODES,
        stable_only=False,
        excluded=(30,),
        memory_pods=PODS,
    )
    assert choice.step == 25
    assert "could not restore step 30" in choice.reason


def scan(rank: int, pod: str, records: tuple[CheckpointRecord, ...]) -> AgentStatus:
    result = agent(rank, attempt=1, records=records)
    assert result.status is not None
    return result.status.model_copy(update={"pfs_available": True, "pod": pod})


def test_a_fresh_scan_of_a_pod_replaces_what_was_known_of_its_memory() -> None:
    known = (record(25, attempt=1), snapshot(30))
    merged = merged_inventory(known, [scan(0, "job-a1-0", (record(25, attempt=1),))])
    by_step = {r.step: r for r in merged}
    assert [c.pod for c in by_step[30].memory] == ["job-a1-1"], "pod 1 has not reported"
    assert by_step[30].pfs == TierCopy()
    both = merged_inventory(merged, [scan(1, "job-a1-1", (record(25, attempt=1),))])
    assert [r.step for r in both] == [25], "neither pod holds step 30 any more"


def test_a_newer_snapshot_replaces_the_older_one_in_the_merge() -> None:
    known = (record(25, attempt=1), snapshot(30))
    fresh = [
        scan(0, "job-a1-0", (record(25, attempt=1), snapshot(40, ("job-a1-0",)))),
        scan(1, "job-a1-1", (record(25, attempt=1), snapshot(40, ("job-a1-1",)))),
    ]
    merged = merged_inventory(known, fresh)
    assert [(r.step, [c.pod for c in r.memory]) for r in merged] == [(25, []), (40, list(PODS))]


def test_a_trip_report_names_the_pod_of_its_memory_copies() -> None:
    records = (snapshot(30, ("job-a1-0",)),)
    report = trip("node-a", attempt=1).model_copy(
        update={"pod": "job-a1-0", "inventory": compact_inventory(records, "node-a", "job-a1-0")}
    )
    (known,) = merged_inventory((), trips=[report])
    assert [c.pod for c in known.memory] == ["job-a1-0"]


def test_a_relaunch_drops_snapshots_of_the_abandoned_lineage() -> None:
    """Attempt 2 resumes from 25 after a rollback: attempt 1's snapshot of 30 is abandoned."""
    kept = without_abandoned((record(25, attempt=1), snapshot(30)), 25, 2)
    assert [r.step for r in kept] == [25]
