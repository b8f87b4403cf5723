"""A launch's or a stop's requests run FANOUT at a time, and one failure loses no other."""

from __future__ import annotations

import threading
import time

import pytest

from stabletrain_operator.kube import FANOUT, each


def test_every_item_runs_at_most_fanout_at_once() -> None:
    lock = threading.Lock()
    in_flight = most = 0
    done: list[int] = []

    def call(item: int) -> None:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.02)
        with lock:
            in_flight -= 1
            done.append(item)

    each(call, list(range(40)))
    assert sorted(done) == list(range(40))
    assert 1 < most <= FANOUT


def test_a_failing_call_stops_no_other_and_its_error_is_raised() -> None:
    done: list[int] = []

    def call(item: int) -> None:
        if item == 3:
            raise RuntimeError("pod 3 refused")
        done.append(item)

    with pytest.raises(RuntimeError, match="pod 3 refused"):
        each(call, list(range(10)))
    assert sorted(done) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
