"""The stall rule: what counts as progress, warm-up, saves, ranks that never started, lag."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from stabletrain_contract.channel import Heartbeat, ThreadPlace
from stabletrain_operator.observe.culprit import stall_suspects
from stabletrain_operator.observe.stall import (
    MAX_STEP_LAG,
    STALL_FLOOR_SECONDS,
    STALL_STEP_FACTOR,
    STARTUP_FLOOR_SECONDS,
    STARTUP_MIN_SECONDS,
    WARMUP_STEPS,
    RankProgress,
    judge_stall,
    stall_bound,
    startup_bound,
)

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
BOUND = 10


def rank(
    number: int,
    *,
    last_step: int | None = 40,
    idle: float = 0.0,
    completed: int = 40,
    place: ThreadPlace = ThreadPlace.TORCH,
    slowest: float | None = 0.5,
    silent: bool = False,
    frame: str = "",
    skew: float = 0.0,
    restored: float | None = None,
) -> RankProgress:
    """Rank `number` on node-<number>, idle `idle` s, its restore over `restored` s ago (None:
    an agent that does not report it); its clock runs `skew` s ahead."""
    agent_now = NOW + timedelta(seconds=skew)
    beat = Heartbeat(
        rank=number,
        started_at=agent_now - timedelta(hours=1),
        training_since=None if restored is None else agent_now - timedelta(seconds=restored),
        steps_completed=completed,
        last_step=last_step,
        last_step_at=None if last_step is None else agent_now - timedelta(seconds=idle),
        slowest_step_seconds=slowest,
        in_step=completed > 0,
        place=place,
        frame=frame,
    )
    return RankProgress(f"job-0-{number}", f"node-{number}", beat, agent_now, NOW, silent)


def test_ranks_that_complete_steps_within_the_bound_are_not_stalled() -> None:
    ranks = [rank(0, idle=BOUND - 0.5), rank(1, idle=BOUND - 0.5)]
    assert judge_stall(ranks, stall_seconds=BOUND, now=NOW) is None


def test_no_step_for_the_bound_stalls_and_names_the_rank_outside_torch() -> None:
    ranks = [
        rank(0, idle=BOUND + 1),
        rank(1, idle=BOUND + 1, place=ThreadPlace.ELSEWHERE, frame="faults.py:48 before_step"),
    ]
    verdict = judge_stall(ranks, stall_seconds=BOUND, now=NOW)
    assert verdict is not None
    assert verdict.last_step == 40
    assert verdict.idle_seconds == BOUND + 1
    ((culprit),) = verdict.culprits
    assert (culprit.rank, culprit.node, culprit.certain) == (1, "node-1", True)
    assert "faults.py:48" in culprit.reason
    assert "rank(s) 0 wait inside torch" in culprit.reason


def test_progress_of_any_rank_is_progress_and_the_operators_later_look_adds_up() -> None:
    """Idle time is the agent's own (served_at - last_step_at) plus the operator's wait since
    the answer; one rank that just finished a step means the job progresses."""
    fresh = rank(0, idle=1.0)
    assert judge_stall([fresh, rank(1, idle=1.0)], stall_seconds=BOUND, now=NOW) is None
    later = NOW + timedelta(seconds=BOUND)
    verdict = judge_stall([fresh, rank(1, idle=1.0)], stall_seconds=BOUND, now=later)
    assert verdict is not None
    assert verdict.idle_seconds == BOUND + 1.0


def test_clock_skew_between_nodes_neither_fakes_nor_hides_a_stall() -> None:
    ahead = [rank(0, idle=2.0, skew=3600.0), rank(1, idle=2.0, skew=-3600.0)]
    assert judge_stall(ahead, stall_seconds=BOUND, now=NOW) is None
    hung = [rank(0, idle=BOUND + 2, skew=3600.0), rank(1, idle=BOUND + 2, skew=-3600.0)]
    assert judge_stall(hung, stall_seconds=BOUND, now=NOW) is not None


def test_the_first_two_steps_of_a_launch_are_warm_up_and_never_a_stall() -> None:
    for completed in (0, 1):
        ranks = [rank(r, idle=10 * BOUND, completed=completed) for r in (0, 1)]
        assert judge_stall(ranks, stall_seconds=BOUND, now=NOW) is None, completed
    ranks = [rank(r, idle=BOUND + 1, completed=2) for r in (0, 1)]
    assert judge_stall(ranks, stall_seconds=BOUND, now=NOW) is not None


def test_a_rank_that_never_started_is_not_judged_and_does_not_hide_one_that_did() -> None:
    never = rank(1, last_step=None, completed=0, place=ThreadPlace.ELSEWHERE)
    assert judge_stall([never], stall_seconds=BOUND, now=NOW) is None
    verdict = judge_stall([rank(0, idle=BOUND + 1), never], stall_seconds=BOUND, now=NOW)
    assert verdict is not None
    assert [c.rank for c in verdict.culprits] == [0]


def test_a_checkpoint_save_on_any_rank_is_not_a_stall() -> None:
    ranks = [rank(0, idle=5 * BOUND), rank(1, idle=5 * BOUND, place=ThreadPlace.CHECKPOINT)]
    assert judge_stall(ranks, stall_seconds=BOUND, now=NOW) is None


def test_agents_that_all_stopped_answering_are_a_run_ending_not_a_stall() -> None:
    """At the end of training each agent stops serving before its process and pod end."""
    ranks = [rank(0, idle=BOUND + 1, silent=True), rank(1, idle=BOUND + 1, silent=True)]
    assert judge_stall(ranks, stall_seconds=BOUND, now=NOW) is None


def test_an_agent_that_stopped_answering_is_the_culprit() -> None:
    ranks = [rank(0, idle=BOUND + 1), rank(1, idle=BOUND + 1, silent=True)]
    verdict = judge_stall(ranks, stall_seconds=BOUND, now=NOW)
    assert verdict is not None
    assert [(c.rank, c.certain) for c in verdict.culprits] == [(1, True)]
    assert "stopped answering" in verdict.culprits[0].reason


def test_every_rank_waiting_in_torch_is_recorded_but_not_certain() -> None:
    ranks = [rank(0, idle=BOUND + 1), rank(1, idle=BOUND + 1)]
    verdict = judge_stall(ranks, stall_seconds=BOUND, now=NOW)
    assert verdict is not None
    assert [(c.rank, c.certain) for c in verdict.culprits] == [(0, False), (1, False)]


def test_the_rank_behind_is_the_culprit_when_places_tell_nothing() -> None:
    ranks = [rank(0, idle=BOUND + 1, last_step=41), rank(1, idle=BOUND + 3, last_step=40)]
    verdict = judge_stall(ranks, stall_seconds=BOUND, now=NOW)
    assert verdict is not None
    assert [(c.rank, c.certain) for c in verdict.culprits] == [(1, True)]


def test_a_slow_rank_in_lockstep_is_not_stalled_but_one_left_behind_is_at_once() -> None:
    slow = [rank(0, idle=BOUND - 1, last_step=41), rank(1, idle=BOUND - 1, last_step=40)]
    assert judge_stall(slow, stall_seconds=BOUND, now=NOW) is None
    behind = 40 - MAX_STEP_LAG - 1
    ranks = [rank(0, idle=0.5), rank(1, idle=BOUND, last_step=behind)]
    verdict = judge_stall(ranks, stall_seconds=BOUND, now=NOW)
    assert verdict is not None
    assert [c.rank for c in verdict.culprits] == [1]
    assert f"{MAX_STEP_LAG + 1} steps behind" in verdict.culprits[0].reason
    at_lag = [rank(0, idle=0.5), rank(1, idle=BOUND, last_step=40 - MAX_STEP_LAG)]
    assert judge_stall(at_lag, stall_seconds=BOUND, now=NOW) is None
    missed_a_scrape = [rank(0, idle=0.5), rank(1, idle=2.0, last_step=behind, silent=True)]
    assert judge_stall(missed_a_scrape, stall_seconds=BOUND, now=NOW) is None


def test_the_default_bound_is_sized_from_the_slowest_recent_step_with_a_floor() -> None:
    assert stall_bound(None, [rank(0, slowest=None)]) is None
    assert stall_bound(None, [rank(0, slowest=0.5)]) == STALL_FLOOR_SECONDS
    assert stall_bound(None, [rank(0, slowest=30.0), rank(1, slowest=20.0)]) == (
        STALL_STEP_FACTOR * 30.0
    )
    assert stall_bound(7, [rank(0, slowest=30.0)]) == 7.0
    slow_steps = [rank(r, idle=STALL_FLOOR_SECONDS - 1, slowest=0.5) for r in (0, 1)]
    assert judge_stall(slow_steps, stall_seconds=None, now=NOW) is None
    hung = [rank(r, idle=STALL_FLOOR_SECONDS + 1, slowest=0.5) for r in (0, 1)]
    assert judge_stall(hung, stall_seconds=None, now=NOW) is not None


def starting(
    number: int, restored: float, *, place: ThreadPlace = ThreadPlace.TORCH, **options: Any
) -> RankProgress:
    """Rank `number` of a fresh (re)launch that has completed no step yet."""
    fields: dict[str, Any] = {"last_step": None, "completed": 0, "slowest": None}
    return rank(number, restored=restored, place=place, **{**fields, **options})


HUNG_FRAME = "faults.py:75 before_step"
START_BOUND = 20
"""detection.stallSeconds of the start-up tests: 2 x 20 s is above STARTUP_MIN_SECONDS."""
STARTUP = WARMUP_STEPS * START_BOUND


def test_a_rank_hung_in_its_first_step_after_a_relaunch_is_stalled_after_the_start_up_bound() -> (
    None
):
    """Rank 1 sleeps in its own code before its first step; rank 0 waits for it in torch."""
    ranks = [
        starting(0, STARTUP + 1),
        starting(1, STARTUP + 1, place=ThreadPlace.ELSEWHERE, frame=HUNG_FRAME),
    ]
    verdict = judge_stall(ranks, stall_seconds=START_BOUND, now=NOW)
    assert verdict is not None
    assert (verdict.bound_seconds, verdict.idle_seconds, verdict.last_step) == (
        STARTUP,
        STARTUP + 1,
        None,
    )
    ((culprit),) = verdict.culprits
    assert (culprit.rank, culprit.node, culprit.certain) == (1, "node-1", True)
    assert HUNG_FRAME in culprit.reason
    assert (
        "rank 1 (node node-1) Elsewhere at faults.py:75 before_step, 41 s since its "
        "restore, 0 step(s) completed" in verdict.evidence
    ), verdict.evidence
    ((suspect),) = stall_suspects(verdict)
    assert (suspect.rank, suspect.node, suspect.avoid) == (1, "node-1", True)
    earlier = [
        starting(0, STARTUP - 1),
        starting(1, STARTUP - 1, place=ThreadPlace.ELSEWHERE, frame=HUNG_FRAME),
    ]
    assert judge_stall(earlier, stall_seconds=START_BOUND, now=NOW) is None
    later = NOW + timedelta(seconds=2)
    assert judge_stall(earlier, stall_seconds=START_BOUND, now=later) is not None, (
        "the operator's wait since the answer adds up"
    )


def test_a_hang_in_the_second_warm_up_step_is_judged_from_the_restore_too() -> None:
    ranks = [
        starting(0, STARTUP + 1, completed=1, last_step=101, idle=STARTUP - 3),
        starting(1, STARTUP + 1, completed=1, last_step=101, idle=STARTUP - 3,
                 place=ThreadPlace.ELSEWHERE, frame=HUNG_FRAME),
    ]  # fmt: skip
    verdict = judge_stall(ranks, stall_seconds=START_BOUND, now=NOW)
    assert verdict is not None
    assert verdict.last_step == 101
    assert [c.rank for c in verdict.culprits] == [1]


def test_a_slow_but_normal_start_is_not_stalled() -> None:
    """Compilation and warm-up: the first steps take long, but end inside the bound."""
    compiling = [starting(r, STARTUP - 1) for r in (0, 1)]
    assert judge_stall(compiling, stall_seconds=START_BOUND, now=NOW) is None
    one_done = [starting(r, STARTUP - 1, completed=1, last_step=1, idle=3.0) for r in (0, 1)]
    assert judge_stall(one_done, stall_seconds=START_BOUND, now=NOW) is None
    unset = [starting(r, STARTUP_FLOOR_SECONDS - 1) for r in (0, 1)]
    assert judge_stall(unset, stall_seconds=None, now=NOW) is None
    hung = [starting(r, STARTUP_FLOOR_SECONDS + 1) for r in (0, 1)]
    verdict = judge_stall(hung, stall_seconds=None, now=NOW)
    assert verdict is not None
    assert [(c.rank, c.certain) for c in verdict.culprits] == [(0, False), (1, False)]
    assert "before a first step since the launch" in verdict.culprits[0].reason


def test_a_rank_inside_its_checkpoint_restore_is_not_stalled() -> None:
    """While it restores, its start-up has not begun (trainingSince is still its agent's
    start, an hour ago) and the other rank waits for it in torch."""
    restoring = starting(1, 3600.0, place=ThreadPlace.CHECKPOINT, frame="manager.py:464 restore")
    ranks = [starting(0, 3600.0), restoring]
    assert judge_stall(ranks, stall_seconds=START_BOUND, now=NOW) is None
    assert judge_stall(ranks, stall_seconds=None, now=NOW) is None


def test_an_older_agent_without_training_since_keeps_its_start_unjudged() -> None:
    ranks = [rank(r, last_step=None, completed=0, slowest=None) for r in (0, 1)]
    assert judge_stall(ranks, stall_seconds=START_BOUND, now=NOW + timedelta(days=1)) is None


def test_a_start_whose_training_ended_or_whose_agents_are_silent_is_not_stalled() -> None:
    ended = [starting(r, STARTUP + 1, place=ThreadPlace.GONE) for r in (0, 1)]
    assert judge_stall(ended, stall_seconds=START_BOUND, now=NOW) is None
    silent = [starting(r, STARTUP + 1, silent=True) for r in (0, 1)]
    assert judge_stall(silent, stall_seconds=START_BOUND, now=NOW) is None
    one_silent = [starting(0, STARTUP + 1), starting(1, STARTUP + 1, silent=True)]
    verdict = judge_stall(one_silent, stall_seconds=START_BOUND, now=NOW)
    assert verdict is not None
    assert [(c.rank, c.certain) for c in verdict.culprits] == [(1, True)]


def test_the_start_up_bound_is_twice_stall_seconds_at_least_a_minimum_or_a_fixed_floor() -> None:
    assert startup_bound(START_BOUND) == WARMUP_STEPS * START_BOUND
    assert startup_bound(5) == STARTUP_MIN_SECONDS, "2 x 5 s is below the minimum"
    assert startup_bound(None) == STARTUP_FLOOR_SECONDS
    warming = [starting(r, STARTUP_MIN_SECONDS - 1) for r in (0, 1)]
    assert judge_stall(warming, stall_seconds=5, now=NOW) is None
