"""What status records is what the pods restore: the checkpoint choice (both tiers, the
explicit no-checkpoint decision), an inventory of what exists now, and the re-plan of a
rollback whose pods could not restore its target."""

from __future__ import annotations

from datetime import timedelta

from operator_builders import NODES, T0, agent, pod, record, spec, trip

from stabletrain_contract.checkpoint.inventory import CheckpointRecord, NodeCopy, TierCopy
from stabletrain_contract.names import Action
from stabletrain_contract.restore import parse_restore_failure, render_restore_failure
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import CheckpointSelection, NoCheckpointDecision
from stabletrain_operator.api.status import Counters, StableTrainingJobStatus
from stabletrain_operator.machine import World, advance
from stabletrain_operator.observe.pod_facts import PodFacts, PodState
from stabletrain_operator.plan.checkpoint import choose_checkpoint
from stabletrain_operator.plan.merged_inventory import merged_inventory, without_abandoned
from stabletrain_operator.policy import PolicyLedger


def local_only_on(step: int, node: str, *, attempt: int = 0) -> CheckpointRecord:
    return record(step, attempt=attempt).model_copy(
        update={"local": (NodeCopy(node=node, complete=True, verified=True),)}
    )


# --- point 2: both tiers -------------------------------------------------------------------


def test_both_tiers_passes_over_a_newer_pfs_only_checkpoint_and_says_what_it_costs() -> None:
    records = [record(40), local_only_on(50, "node-a")]
    both = choose_checkpoint(records, 55, NODES)
    assert both.step == 40
    assert "10 more steps than step 50" in both.reason
    assert "node-b" in both.reason
    pfs = choose_checkpoint(records, 55, NODES, selection=CheckpointSelection.PFS_VERIFIED)
    assert pfs.step == 50
    assert "node-b re-seed" in pfs.reason


def test_both_tiers_takes_the_pfs_copy_only_when_no_candidate_is_on_every_node() -> None:
    """node-b ran attempt 0 (it holds step 60, past the bound) but holds neither 40 nor 50."""
    records = [local_only_on(40, "node-a"), local_only_on(50, "node-a"), record(60)]
    chosen = choose_checkpoint(records, 55, NODES)
    assert chosen.step == 50
    assert "no checkpoint at or before step 55 is on every node's local tier" in chosen.reason


def test_a_node_that_never_ran_the_attempt_reads_the_newest_from_the_pfs() -> None:
    """The chaos run's hang: rank 0 moves to node-c, which holds step 5550 of attempt 2 from
    an earlier stay and nothing of attempt 4. BothTiers took 5550 (3,125 steps back); node-c
    could never hold 8675 locally, so it re-seeds it from the PFS like a new node."""
    old = record(5550, attempt=2).model_copy(
        update={"local": tuple(NodeCopy(node=n, complete=True, verified=True)
                               for n in ("node-a", "node-b", "node-c"))}
    )  # fmt: skip
    newest = record(8675, attempt=4, stable=False).model_copy(
        update={"local": tuple(NodeCopy(node=n, complete=True, verified=True)
                               for n in ("node-a", "node-b"))}
    )  # fmt: skip
    chosen = choose_checkpoint([old, newest], None, ("node-c", "node-b"), stable_only=False)
    assert chosen.step == 8675
    assert "nodes node-c re-seed their local tier from it" in chosen.reason
    assert "they hold no copy of attempt 4" in chosen.reason
    torn_on_c = newest.model_copy(
        update={"local": (*newest.local, NodeCopy(node="node-c", complete=False))}
    )
    kept = choose_checkpoint([old, torn_on_c], None, ("node-c", "node-b"), stable_only=False)
    assert kept.step == 5550, "node-c ran attempt 4 and its copy is torn: both tiers go back"
    assert "3125 more steps than step 8675" in kept.reason


def test_the_planned_event_and_history_say_what_both_tiers_cost() -> None:
    """Before: step 50, on node-a's local tier and the PFS only, was chosen (the README
    promised both tiers). After: step 40, with the cost in the Event and in status."""
    records = (record(30), record(40), local_only_on(50, "node-a"))
    job = spec_with_rollback({"minStepsBeforeOnset": 10})
    status = StableTrainingJobStatus(
        phase=Phase.RUNNING, attempt=0, directives_generation=1, step=62, checkpoints=records
    )
    pods = tuple(
        pod(r, state=PodState.FAILED, report=trip(n, step=62, onset=60, signal="LossSpike"))
        for r, n in enumerate(NODES)
    )
    step = advance(status, world(status, job, pods=pods))
    events = []
    while step.status.phase is not Phase.CONFIRMING:
        step = advance(step.status, world(step.status, job))
        events += step.events
    (planned,) = [e.message for e in events if e.reason == "Planned"]
    assert "resumes from step 40" in planned
    assert "10 more steps than step 50" in planned
    assert "10 more steps than step 50" in step.status.rollback_history[-1].checkpoint_choice


# --- point 3: no checkpoint far enough back ------------------------------------------------

EARLY = [record(25), record(50), record(75, stable=False)]
"""An early spike (onset 60, margin 100): nothing lies at or before the bound 0; step 75 was
saved inside the spike."""


def test_no_checkpoint_far_enough_narrows_the_margin_to_a_step_before_the_onset() -> None:
    chosen = choose_checkpoint(
        EARLY, 0, NODES, onset=60, when_none=NoCheckpointDecision.NARROW_MARGIN
    )
    assert chosen.usable
    assert chosen.step == 50
    assert "margin narrowed to 10 steps before onset 60" in chosen.reason


def test_no_checkpoint_far_enough_never_resumes_at_or_after_the_onset() -> None:
    inside = [record(50), record(60), record(75)]
    chosen = choose_checkpoint(
        inside, 0, NODES, onset=60, when_none=NoCheckpointDecision.NARROW_MARGIN
    )
    assert chosen.step == 50, "60 is the onset itself"
    nothing = choose_checkpoint(
        [record(60), record(75)], 0, NODES, onset=60, when_none=NoCheckpointDecision.NARROW_MARGIN
    )
    assert (nothing.step, nothing.usable) == (0, True)
    assert "starting from step 0" in nothing.reason


def test_no_checkpoint_far_enough_from_scratch_or_fail_as_the_rule_says() -> None:
    scratch = choose_checkpoint(
        EARLY, 0, NODES, onset=60, when_none=NoCheckpointDecision.FROM_SCRATCH
    )
    assert (scratch.step, scratch.usable) == (0, True)
    assert "nothing restored" in scratch.reason
    fail = choose_checkpoint(EARLY, 0, NODES, onset=60, when_none=NoCheckpointDecision.FAIL)
    assert not fail.usable
    assert "the rule says Fail" in fail.reason


def early_spike_status(decision: str) -> StableTrainingJobStatus:
    job = spec_with_rollback({"noCheckpointFarEnough": decision})
    status = StableTrainingJobStatus(
        phase=Phase.RUNNING, attempt=0, directives_generation=1, step=62, checkpoints=EARLY
    )
    pods = tuple(
        pod(r, state=PodState.FAILED, report=trip(n, step=62, onset=60, signal="LossSpike"))
        for r, n in enumerate(NODES)
    )
    step = advance(status, world(status, job, pods=pods))
    while step.status.phase is not Phase.CONFIRMING and step.status.phase is not Phase.FAILED:
        step = advance(step.status, world(step.status, job))
    return step.status


def spec_with_rollback(params: dict[str, object]) -> object:
    rollback = {"minStepsBeforeOnset": 100, "rewarmupSteps": 4, **params}
    return spec(
        recovery={
            "rules": [
                {"name": "spike", "onSignals": ["LossSpike"], "action": "Rollback",
                 "rollback": rollback},
                {"name": "infra", "onSignals": ["WorkerFailure"], "action": "RestartFromLatest"},
            ]
        }
    )  # fmt: skip


def world(status: StableTrainingJobStatus, job: object, **changes: object) -> World:
    base: dict[str, object] = {
        "now": T0,
        "job": "job",
        "spec": job,
        "generation": 1,
        "pods": (),
        "ledger": PolicyLedger.from_job_status(status),
        "previous_nodes": NODES,
    }
    base.update(changes)
    return World(**base)  # type: ignore[arg-type]


def test_early_spike_records_the_step_the_directives_make_the_pods_restore() -> None:
    """Before: target null ("scratch"), directives resumeStep null, and the pods restored
    the newest checkpoint (75, inside the spike). After: the step in status is the step in
    the directives, and the decision says which path was taken."""
    narrowed = early_spike_status("NarrowMargin")
    (entry,) = narrowed.rollback_history
    assert entry.to_step == 50
    assert "margin narrowed to 10 steps" in entry.checkpoint_choice
    scratch = early_spike_status("FromScratch")
    (entry,) = scratch.rollback_history
    assert entry.to_step == 0
    assert "starting from step 0" in entry.checkpoint_choice
    failed = early_spike_status("Fail")
    assert failed.phase is Phase.FAILED
    assert any(c.reason == "NoUsableCheckpoint" for c in failed.conditions)


def test_scratch_directives_name_step_zero_and_keep_the_re_warm_up() -> None:
    job = spec_with_rollback({"noCheckpointFarEnough": "FromScratch"})
    status = StableTrainingJobStatus(
        phase=Phase.RUNNING, attempt=0, directives_generation=1, step=62, checkpoints=EARLY
    )
    pods = tuple(
        pod(r, state=PodState.FAILED, report=trip(n, step=62, onset=60, signal="LossSpike"))
        for r, n in enumerate(NODES)
    )
    step = advance(status, world(status, job, pods=pods))
    while step.launch is None:
        step = advance(step.status, world(step.status, job))
    assert step.launch.directives.resume_step == 0
    assert step.launch.directives.rewarmup_steps == 4
    assert step.launch.directives.skip


# --- point 10 (a): the inventory is what exists now ------------------------------------------


def scanned(rank: int, records: tuple[CheckpointRecord, ...], attempt: int = 1) -> object:
    result = agent(rank, attempt=attempt, records=records)
    assert result.status is not None
    return result.status.model_copy(update={"pfs_available": True})


def test_a_fresh_scan_drops_what_retention_deleted() -> None:
    """Before: every record ever seen stayed (a union), so a rollback planned step 50 of the
    resumed attempt long after retention deleted it, and its pods loaded 25 instead."""
    known = (record(25), record(50, attempt=1), record(75, attempt=1))
    now = (record(25), record(200, attempt=1), record(225, attempt=1))
    merged = merged_inventory(known, [scanned(0, now), scanned(1, now)])  # type: ignore[list-item]
    assert [(r.step, r.attempt) for r in merged] == [(25, 0), (200, 1), (225, 1)]


def test_a_fresh_scan_of_one_node_keeps_the_other_nodes_local_copies_only() -> None:
    known = (record(50),)
    merged = merged_inventory(known, [scanned(0, ())])  # type: ignore[list-item]
    (kept,) = merged
    assert [c.node for c in kept.local] == ["node-b"]
    assert kept.pfs == TierCopy(), "node-a's scan saw the whole PFS without step 50"


def test_a_complete_pfs_copy_stays_complete_while_a_later_scan_still_lists_it() -> None:
    """node-a scanned before node-b's part of step 50 landed; node-b saw it complete."""
    complete = (record(50),)
    incomplete = (record(50, pfs=False),)
    seen = merged_inventory((), [scanned(1, complete)])  # type: ignore[list-item]
    later = merged_inventory(seen, [scanned(0, incomplete)])  # type: ignore[list-item]
    (kept,) = later
    assert kept.pfs.verified
    assert [c.node for c in kept.local] == list(NODES)


def test_an_agent_that_has_not_scanned_yet_only_adds() -> None:
    known = (record(50),)
    started = agent(0, attempt=1, records=()).status
    assert started is not None
    assert started.pfs_available is None
    assert merged_inventory(known, [started]) == known


def test_a_trip_report_cut_to_4_kib_replaces_only_from_its_oldest_entry() -> None:
    known = (record(10), record(20), record(30))
    report = trip("node-a", records=(record(30), record(40))).model_copy(
        update={"inventory_omitted": 2}
    )
    merged = merged_inventory(known, trips=[report])
    steps = [r.step for r in merged]
    assert steps == [10, 20, 30, 40]


def test_a_relaunch_drops_what_its_resume_abandoned() -> None:
    """The agents' fence rule: after attempt 1 resumes from 25, attempt 0's 50 is gone."""
    records = (record(25), record(50), record(50, attempt=1), record(75, attempt=1))
    kept = without_abandoned(records, 25, 1)
    assert [(r.step, r.attempt) for r in kept] == [(25, 0), (50, 1), (75, 1)]


# --- point 10 (b): a target the pods cannot restore is re-planned ----------------------------


def restore_failed(rank: int, attempt: int, step: int) -> PodFacts:
    message = render_restore_failure(step, attempt, "no restorable checkpoint of step 50")
    return PodFacts(
        name=f"job-a{attempt}-{rank}",
        attempt=attempt,
        rank=rank,
        state=PodState.FAILED,
        node=NODES[rank],
        ip=None,
        deleting=False,
        exit_code=1,
        reason="Error",
        message=message,
        restore_failure=parse_restore_failure(message),
    )


def test_second_rollback_whose_target_is_gone_is_re_planned_inside_its_bound() -> None:
    """Before: the pods' failure counted as a WorkerFailure and RestartFromLatest resumed
    next to the spike (step 250, onset 260). After: the same escalated rollback is planned
    again without step 50, older than its bound, with no budget spent."""
    job = spec_with_rollback({"minStepsBeforeOnset": 100})
    history = (record(25), record(50, attempt=1), record(250, attempt=1))
    status = StableTrainingJobStatus(
        phase=Phase.RUNNING, attempt=1, directives_generation=2, step=262, checkpoints=history
    )
    pods = tuple(
        pod(r, attempt=1, state=PodState.FAILED,
            report=trip(n, step=262, onset=260, signal="LossSpike", attempt=1))
        for r, n in enumerate(NODES)
    )  # fmt: skip
    step = advance(status, world(status, job, pods=pods))
    while step.status.phase is not Phase.CONFIRMING:
        step = advance(step.status, world(step.status, job))
    assert step.status.plan is not None
    assert step.status.plan.target_step == 50
    counters = step.status.counters
    failed = (restore_failed(0, 2, 50), pod(1, attempt=2))
    again = advance(step.status, world(step.status, job, pods=failed))
    assert again.status.phase is Phase.STOPPING
    plan = again.status.plan
    assert plan is not None
    assert (plan.action, plan.excluded_steps, plan.next_attempt) == (Action.ROLLBACK, (50,), 3)
    assert again.status.counters == counters, "the same rollback: no budget, no restart"
    assert [e.reason for e in again.events] == ["RestoreFailed"]
    later = T0 + timedelta(seconds=5)
    step = advance(again.status, world(again.status, job, now=later))
    while step.status.phase is not Phase.CONFIRMING:
        step = advance(step.status, world(step.status, job, now=later))
    assert step.launch is not None
    assert step.launch.directives.resume_step == 25, "older, inside the bound; never 250"
    assert [(e.to_step, e.attempt) for e in step.status.rollback_history] == [(25, 3)]
    choice = step.status.rollback_history[-1].checkpoint_choice
    assert "the pods could not restore step 50" in choice
    assert step.status.counters.restarts == 0


def test_a_restore_failure_with_nothing_older_takes_the_no_checkpoint_decision() -> None:
    job = spec_with_rollback({"noCheckpointFarEnough": "Fail"})
    status = StableTrainingJobStatus(
        phase=Phase.CONFIRMING,
        attempt=1,
        directives_generation=2,
        step=20,
        checkpoints=(record(20),),
        counters=Counters(rollbacks=1),
        plan={
            "action": Action.ROLLBACK, "rule": "spike", "signal": "LossSpike",
            "onset_step": 130, "from_step": 132, "started_at": T0, "from_attempt": 0,
            "next_attempt": 1, "target_step": 20, "directives_generation": 2, "lr_scale": 0.5,
        },
    )  # fmt: skip
    again = advance(status, world(status, job, pods=(restore_failed(0, 1, 20),)))
    step = advance(again.status, world(again.status, job))
    step = advance(step.status, world(step.status, job))
    assert step.status.phase is Phase.FAILED
    reasons = {c.reason for c in step.status.conditions if c.type == "Failed"}
    assert reasons == {"NoUsableCheckpoint"}
