"""Attribution: which rank and node an incident is pinned on, and a crash loop's cause."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from stabletrain_operator.api.spec import CrashLoopAction, CrashLoopSpec
from stabletrain_operator.api.status import FailureRecord
from stabletrain_operator.observe.culprit import (
    PEERS_AWAITED,
    awaiting_peers,
    failure_record,
    failure_side,
    failure_signature,
    failure_suspects,
)
from stabletrain_operator.observe.pod_facts import PodFacts, PodState
from stabletrain_operator.policy.crashloop import crash_loop

T = datetime(2026, 1, 1, 12, tzinfo=UTC)
TORCHRUN_KILLED = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 4242)
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================"""
TORCHRUN_PEER_GONE = """RuntimeError: Connection closed by peer [10.0.0.2]:40123
  exitcode  : 1 (pid: 4141)"""
IMPORT_ERROR = """Traceback (most recent call last):
  File "/app/train.py", line 3, in <module>
    import missing_helpers
ModuleNotFoundError: No module named 'missing_helpers'
============================================================
train.py FAILED"""


def pod(
    rank: int,
    *,
    node: str,
    finished: float | None = 0.0,
    message: str = "",
    reason: str = "Error",
    exit_code: int | None = 1,
    state: PodState = PodState.FAILED,
    attempt: int = 0,
) -> PodFacts:
    return PodFacts(
        name=f"job-{attempt}-{rank}",
        attempt=attempt,
        rank=rank,
        state=state,
        node=node,
        ip=None,
        deleting=state is PodState.GONE,
        exit_code=exit_code,
        reason=reason,
        message=message,
        finished_at=None if finished is None else T + timedelta(seconds=finished),
    )


def test_the_pod_that_ended_first_is_the_culprit_not_the_ones_that_lost_their_peer() -> None:
    (suspect,) = failure_suspects(
        [pod(0, node="a", finished=1.0, message=TORCHRUN_PEER_GONE), pod(1, node="b")]
    )
    assert (suspect.rank, suspect.node, suspect.avoid) == (1, "b", True)
    assert suspect.reason == "pod job-0-1 on node b: Error with exit code 1"


def test_the_rank_killed_by_a_signal_is_the_culprit_even_if_its_pod_ended_last() -> None:
    """Seen with torchrun: the victim's worker fails on the broken collective and its pod
    ends at once, while the killed worker's torchrun tears its rendezvous down first."""
    (suspect,) = failure_suspects(
        [
            pod(0, node="a", finished=0.0, message=TORCHRUN_PEER_GONE),
            pod(1, node="b", finished=4.0, message=TORCHRUN_KILLED),
        ]
    )
    assert (suspect.rank, suspect.node, suspect.avoid) == (1, "b", True)


def test_within_the_same_second_the_rank_killed_by_a_signal_is_the_culprit() -> None:
    (suspect,) = failure_suspects(
        [
            pod(0, node="a", message=TORCHRUN_PEER_GONE),
            pod(1, node="b", message=TORCHRUN_KILLED),
        ]
    )
    assert (suspect.rank, suspect.node, suspect.avoid) == (1, "b", True)
    assert "killed by signal 9" in suspect.reason


def test_the_first_pod_to_fail_while_the_others_still_run_is_certain() -> None:
    """Seen in the bad-node e2e: the decision comes as soon as one pod ended."""
    (suspect,) = failure_suspects([pod(1, node="b", message=TORCHRUN_KILLED)], pods=2)
    assert (suspect.rank, suspect.node, suspect.avoid) == (1, "b", True)
    (plain,) = failure_suspects([pod(1, node="b")], pods=2)
    assert plain.avoid
    (alone,) = failure_suspects([pod(0, node="a")], pods=1)
    assert not alone.avoid, "a one-pod job: nothing to tell it apart from"


def test_a_victim_that_ended_first_waits_for_the_running_rank_whose_end_names_the_culprit() -> None:
    """Seen in CI (the bad-node e2e test): the victim on node a ended on the broken
    collective while the killed rank's pod on node b still ran; deciding then avoided a."""
    victim = pod(0, node="a", finished=0.0, message=TORCHRUN_PEER_GONE)
    still_running = pod(1, node="b", finished=None, state=PodState.RUNNING, exit_code=None)
    now = T + timedelta(seconds=1)
    assert awaiting_peers([victim], [victim, still_running], now)
    killed = pod(1, node="b", finished=3.0, message=TORCHRUN_KILLED)
    assert not awaiting_peers([victim, killed], [victim, killed], now)
    (suspect,) = failure_suspects([victim, killed])
    assert (suspect.node, suspect.avoid) == ("b", True)


def test_the_wait_for_running_peers_ends_after_the_bound_and_never_holds_evidence() -> None:
    alone = pod(1, node="b", finished=0.0)
    running = pod(0, node="a", finished=None, state=PodState.RUNNING, exit_code=None)
    assert not awaiting_peers([alone], [alone, running], T + PEERS_AWAITED)
    (suspect,) = failure_suspects([alone], pods=2)
    assert (suspect.node, suspect.avoid) == ("b", True), "still alone: told apart"
    killed = pod(1, node="b", finished=0.0, message=TORCHRUN_KILLED)
    oom = pod(1, node="b", finished=0.0, reason="OOMKilled", exit_code=137)
    lost = pod(1, node="b", finished=None, state=PodState.GONE)
    for evidence in (killed, oom, lost):
        assert not awaiting_peers([evidence], [evidence, running], T), evidence.reason
    both = [pod(0, node="a", finished=0.0), pod(1, node="b", finished=0.0)]
    assert not awaiting_peers(both, both, T), "nobody left to wait for"


def test_a_running_peer_whose_agent_went_silent_is_the_culprit_without_waiting() -> None:
    """Seen in `make chaos`: node b was lost, its pod still Running (the node controller
    had not marked it yet) and its agent silent; after the wait the victim on node a, the
    only pod seen ended, was blamed and its healthy node avoided."""
    victim = pod(0, node="a", finished=0.0, message=TORCHRUN_PEER_GONE)
    lost = pod(1, node="b", finished=None, state=PodState.RUNNING, exit_code=None)
    now = T + timedelta(seconds=1)
    assert awaiting_peers([victim], [victim, lost], now)
    assert not awaiting_peers([victim], [victim, lost], now, silent=[lost])
    (suspect,) = failure_suspects([victim], pods=2, silent=[lost])
    assert (suspect.rank, suspect.node, suspect.avoid) == (1, "b", True)
    assert suspect.reason == (
        "pod job-0-1 on node b: its agent stopped answering, and job-0-0 failed on the "
        "broken collective"
    )


def test_a_rank_killed_by_a_signal_stays_the_culprit_beside_a_silent_one() -> None:
    killed = pod(1, node="b", message=TORCHRUN_KILLED)
    quiet = pod(0, node="a", finished=None, state=PodState.RUNNING, exit_code=None)
    (suspect,) = failure_suspects([killed], pods=2, silent=[quiet])
    assert (suspect.node, suspect.avoid) == ("b", True)
    assert "killed by signal 9" in suspect.reason


def test_a_tie_without_evidence_is_recorded_but_no_node_is_avoided() -> None:
    suspects = failure_suspects([pod(0, node="a"), pod(1, node="b")])
    assert [(s.rank, s.avoid) for s in suspects] == [(0, False), (1, False)]


def test_lost_evicted_and_oom_killed_pods_point_at_their_node_by_themselves() -> None:
    lost = pod(1, node="b", state=PodState.GONE, reason="Vanished", finished=None, exit_code=None)
    oom = pod(0, node="a", finished=5.0, reason="OOMKilled", exit_code=137)
    suspects = failure_suspects([oom, lost, pod(2, node="c", finished=0.0)])
    assert sorted((s.rank, s.node, s.avoid) for s in suspects) == [(0, "a", True), (1, "b", True)]


def test_the_failure_signature_is_the_error_line_of_the_pods_own_words() -> None:
    assert failure_signature(pod(0, node="a", message=IMPORT_ERROR)) == (
        "ModuleNotFoundError: No module named 'missing_helpers'"
    )
    assert failure_signature(pod(1, node="b", message=TORCHRUN_KILLED)) == "killed by signal 9"
    assert failure_signature(pod(1, node="b", exit_code=137, reason="Error")) == (
        "killed by signal 9"
    )


def _record(
    attempt: int, nodes: tuple[str, ...], *, progressed: bool = False, step: int | None = None
) -> FailureRecord:
    failed = [pod(i, node=n, message=IMPORT_ERROR, attempt=attempt) for i, n in enumerate(nodes)]
    return failure_record(
        attempt, failed, failure_suspects(failed), progressed=progressed, step=step
    )


def test_every_rank_failing_before_its_first_step_is_a_crash_loop_of_the_job() -> None:
    current = _record(0, ("a", "b"))
    assert current.before_first_step
    loop = crash_loop(CrashLoopSpec(), current, None, every_rank_failed=True)
    assert loop is not None
    assert loop.action is CrashLoopAction.FAIL
    assert "every rank of attempt 0 failed before its first step" in loop.message
    assert "the job's" in loop.message
    assert (
        "first step: the failing rank exited with code 1: ModuleNotFoundError: No module "
        "named 'missing_helpers'; looks like" in loop.message
    ), "the rank's error line and exit code, not torchrun's summary after it"
    assert "FAILED" not in loop.message
    assert "Traceback" not in loop.message
    assert crash_loop(CrashLoopSpec(), current, None, every_rank_failed=False) is None


def test_the_same_error_two_attempts_in_a_row_on_other_nodes_is_the_jobs_fault() -> None:
    previous = _record(0, ("a", "b"), progressed=True)
    current = _record(1, ("c", "d"), progressed=True)
    assert failure_side(current, previous).startswith("the job's: the same error on different")
    spec = CrashLoopSpec(action=CrashLoopAction.BACKOFF, backoff_seconds=900)
    loop = crash_loop(spec, current, previous, every_rank_failed=False)
    assert loop is not None
    assert (loop.action, loop.backoff_seconds) == (CrashLoopAction.BACKOFF, 900)
    assert "the same error ended attempts 0 and 1" in loop.message
    older = _record(0, ("a", "b"), progressed=True)
    assert (
        crash_loop(spec, _record(2, ("c",), progressed=True), older, every_rank_failed=False)
        is None
    )


def test_the_same_error_after_getting_further_is_a_new_incident_not_a_loop() -> None:
    """Seen in a chaos run's plan: two SIGKILLs of a rank in a row, each after progress, would
    have failed the job as a crash loop under the default policy."""
    spec = CrashLoopSpec()
    previous = _record(0, ("a", "b"), progressed=True, step=3000)
    assert crash_loop(spec, _record(1, ("a", "c"), progressed=True, step=6000), previous,
                      every_rank_failed=False) is None  # fmt: skip
    again = crash_loop(spec, _record(1, ("a", "c"), progressed=True, step=3000), previous,
                       every_rank_failed=False)  # fmt: skip
    assert again is not None, "the same error at the same step again is a loop"
    assert "the same error ended attempts 0 and 1" in again.message


def test_failures_that_follow_one_node_look_like_the_nodes_fault() -> None:
    previous = _record(0, ("a", "bad"), progressed=True)
    current = _record(1, ("c", "bad"), progressed=True)
    assert "node bad" in failure_side(current, previous)
