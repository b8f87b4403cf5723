"""What a job's daemon holds between ticks stays small: one attempt's directives and the one
before, not every attempt's."""

from __future__ import annotations

from stabletrain_contract.directives import Directives
from stabletrain_operator.reconcile import JobMemory, _remember_directives


def test_only_the_newest_attempt_s_directives_and_the_one_before_are_kept() -> None:
    memory = JobMemory()
    for attempt in range(6):
        _remember_directives(memory, attempt, Directives(generation=1, attempt=attempt))
    assert sorted(memory.directives) == [4, 5]
    # The current attempt's, read again while the next is already stored, stays too.
    _remember_directives(memory, 4, Directives(generation=2, attempt=4))
    assert sorted(memory.directives) == [4, 5]
    assert memory.directives[4].generation == 2
