"""Registers the shared fixtures and marks tests by directory, so `-m "not integration"` works."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = [
    "support.fixtures",
    "support.localnode.fixtures",
    "support.operator_fixtures",
]

_MARK_BY_DIRECTORY = {"integration": pytest.mark.integration, "e2e": pytest.mark.e2e}


_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        top = item.path.relative_to(_TESTS).parts[0]
        mark = _MARK_BY_DIRECTORY.get(top)
        if mark is not None:
            item.add_marker(mark)
