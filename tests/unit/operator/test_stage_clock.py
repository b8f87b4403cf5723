"""A phase change's log line says where its tick's time went: the wake's wait, then each
stage in order (bench/operator_scale.py splits a trip's latency by it)."""

from __future__ import annotations

from stabletrain_operator.reconcile import StageClock


def test_each_stage_is_the_time_since_the_one_before() -> None:
    clock = StageClock(woken_at=9.5, marks=[("", 10.0)])
    clock.marks += [("look and scrape", 10.25), ("decide", 10.26), ("write", 11.76)]
    assert clock.summary() == (
        "woken 0.50 s before; look and scrape 0.25 s, decide 0.01 s, write 1.50 s"
    )


def test_a_tick_on_time_has_no_wake() -> None:
    clock = StageClock(woken_at=None, marks=[("", 3.0)])
    clock.mark("write")
    assert clock.summary().startswith("write ")
    assert "woken" not in clock.summary()
