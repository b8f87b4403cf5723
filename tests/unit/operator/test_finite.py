"""NaN and infinity replaced by what each consumer can carry, and nothing else touched."""

from __future__ import annotations

import math

from stabletrain_operator.finite import finite_or, non_finite_replaced


def test_finite_numbers_pass_and_the_rest_fall_back() -> None:
    assert finite_or(1.5, None) == 1.5
    assert finite_or(0.0, math.nan) == 0.0
    assert finite_or(None, None) is None
    assert finite_or(math.inf, None) is None
    assert math.isnan(finite_or(-math.inf, math.nan))
    assert math.isnan(finite_or(math.nan, math.nan))


def test_every_non_finite_float_is_replaced_at_any_depth() -> None:
    data = {"a": math.nan, "b": [1, 2.5, math.inf, {"c": -math.inf}], "d": "nan", "e": None}
    assert non_finite_replaced(data, lambda _: None) == {
        "a": None, "b": [1, 2.5, None, {"c": None}], "d": "nan", "e": None
    }  # fmt: skip
    assert non_finite_replaced([math.inf, -math.inf], str) == ["inf", "-inf"]
