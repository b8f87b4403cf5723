"""The one exception the CLI turns into a message instead of a traceback."""

from __future__ import annotations


class CliError(Exception):
    """A problem the person at the terminal can fix; `str()` says what and where."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


USAGE_EXIT = 2
"""Exit code for bad input (a malformed file or argument), as argparse uses."""
