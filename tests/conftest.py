"""Registers the shared fixtures and marks tests by directory, so `-m "not integration"` works."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = [
    "support.fixtures",
    "support.localnode.fixtures",
    "support.operator_fixtures",
    "support.kueue_fixtures",
]

_MARK_BY_DIRECTORY = {"integration": pytest.mark.integration, "e2e": pytest.mark.e2e}


_TESTS = Path(__file__).parent
_CHART_TESTS = _TESTS / "unit" / "chart"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Long chaos scenarios stay out of `make test` (its cold-run budget) unless asked for.
    chaos_selected = "chaos" in (config.option.markexpr or "")
    for item in items:
        top = item.path.relative_to(_TESTS).parts[0]
        mark = _MARK_BY_DIRECTORY.get(top)
        if mark is not None:
            item.add_marker(mark)
        if item.path.is_relative_to(_CHART_TESTS):
            # They need helm and the PromQL checker: `make unit` leaves them (and the Go
            # build of those) out unless asked for.
            item.add_marker(pytest.mark.chart)
        if item.get_closest_marker("chaos") and not chaos_selected:
            item.add_marker(pytest.mark.skip(reason="a long chaos scenario: runs with -m chaos"))
