"""DirectiveSource: initial directives from the pod's env/file, live offers by generation."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from stabletrain_agent.endpoint.directive_inbox import DirectivesError, DirectiveSource
from stabletrain_contract import env
from stabletrain_contract.channel import LiveOutcome
from stabletrain_contract.directives import Directives


def _directives(generation: int, attempt: int = 2, **fields: object) -> Directives:
    return Directives.model_validate(
        {"generation": generation, "attempt": attempt, "resumeStep": 400, **fields}
    )


def test_initial_directives_come_from_the_file_the_env_names(tmp_path: Path) -> None:
    path = tmp_path / "directives.json"
    path.write_text(_directives(3, lrScale=0.5).to_json())
    source = DirectiveSource.from_env({env.ATTEMPT: "2", env.DIRECTIVES_PATH: str(path)})
    latest = source.latest()
    assert latest is not None
    assert (latest.generation, latest.lr_scale, latest.resume_step) == (3, 0.5, 400)
    assert source.applied_generation == 3


def test_a_named_but_missing_or_broken_file_is_an_error_never_a_silent_default(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "absent.json"
    with pytest.raises(DirectivesError, match=r"absent\.json"):
        DirectiveSource.from_env({env.DIRECTIVES_PATH: str(missing)})
    broken = tmp_path / "broken.json"
    broken.write_text('{"generation": 0, "attempt": 2, "lrScale": 3}')
    with pytest.raises(DirectivesError, match=r"broken.json[\s\S]*generation[\s\S]*lrScale"):
        DirectiveSource.from_env({env.ATTEMPT: "2", env.DIRECTIVES_PATH: str(broken)})


def test_directives_of_another_attempt_are_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "directives.json"
    path.write_text(_directives(3, attempt=1).to_json())
    with pytest.raises(DirectivesError, match=r"attempt 1 .* attempt 2"):
        DirectiveSource.from_env({env.ATTEMPT: "2", env.DIRECTIVES_PATH: str(path)})
    with pytest.raises(DirectivesError, match="STABLETRAIN_ATTEMPT"):
        DirectiveSource.from_env({env.ATTEMPT: "two"})


def test_live_offers_apply_only_newer_generations_of_this_attempt() -> None:
    source = DirectiveSource(attempt=2, initial=_directives(3))
    newer = source.offer(_directives(5, lrScale=0.25))
    assert (newer.outcome, newer.applied_generation) == (LiveOutcome.APPLIED, 5)
    stale = source.offer(_directives(4, lrScale=0.9))
    assert (stale.outcome, stale.applied_generation) == (LiveOutcome.ALREADY_APPLIED, 5)
    repeat = source.offer(_directives(5, lrScale=0.25))
    assert repeat.outcome is LiveOutcome.ALREADY_APPLIED
    other_attempt = source.offer(_directives(9, attempt=3))
    assert other_attempt.outcome is LiveOutcome.WRONG_ATTEMPT
    moved = source.offer(_directives(9, resumeStep=100))
    assert moved.outcome is LiveOutcome.RESUME_STEP_CHANGED
    latest = source.latest()
    assert latest is not None
    assert (latest.generation, latest.lr_scale) == (5, 0.25)


def test_a_standalone_run_accepts_live_directives_without_a_resume_step() -> None:
    source = DirectiveSource(attempt=0)
    assert source.latest() is None
    assert source.applied_generation == 0
    refused = source.offer(_directives(1, attempt=0))  # carries resumeStep 400
    assert refused.outcome is LiveOutcome.RESUME_STEP_CHANGED
    accepted = source.offer(_directives(1, attempt=0, resumeStep=None, lrScale=0.5))
    assert accepted.outcome is LiveOutcome.APPLIED
    assert source.applied_generation == 1


def test_concurrent_offers_end_with_the_highest_generation() -> None:
    source = DirectiveSource(attempt=2, initial=_directives(1))
    generations = list(range(2, 202))
    threads = [
        threading.Thread(target=lambda g=g: source.offer(_directives(g))) for g in generations
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert source.applied_generation == max(generations)
