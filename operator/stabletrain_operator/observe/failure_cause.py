"""The failing rank's own words in a torchrun log tail, and the exit code it ended with.

What the operator has of a crash is text: a pod's termination message, which with
`FallbackToLogsOnError` is the last 2 KiB (80 lines) of its log, and the same kind of tail
for a restart inside a pod. Under torchrun that tail ends with the launcher's summary: its
own log lines, the traceback of its `ChildFailedError` and a box whose "Root Cause" names
the rank and its exit code, while the launcher itself exits 1 whatever the rank did. The
line a person needs (`train.py: error: unrecognized arguments: --no-such-flag`, or an
exception's message) sits just before that summary. This module takes the tail apart
without any I/O, so the pod watch, the crash-loop rule and an in-place restart all quote
the same thing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LINE_MAX = 300
"""Characters kept of one quoted line."""
LINES_MAX = 3
"""Lines of one exception message quoted (a message may span lines)."""

_LAUNCHER_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ torch/distributed/\S+\]")
"""A log line of torchrun itself (glog-style prefix, a torch.distributed source file)."""
_TRACEBACK = "Traceback (most recent call last):"
_CHILD_FAILED = "ChildFailedError"
_BOX_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_BOX_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_LOG_EXIT = re.compile(r"failed \(exitcode: (-?\d+)\)")
_ARGPARSE_ERROR = re.compile(r"^\S+: error: \S")
"""argparse's last words: `<prog>: error: <message>`."""
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(: .*)?$")
"""The first line after a traceback's frames: `module.ExceptionClass: message`."""
_FRAME = re.compile(r'^\s+File ".*", line \d+')
_NAMED_ERROR = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b(: .*)?$")


@dataclass(frozen=True)
class FailureCause:
    """What the tail says about the failing rank; empty when it says nothing usable."""

    lines: tuple[str, ...] = ()
    """The rank's own last error line(s): an exception with its message, or an `error:`
    line; empty when the tail holds neither (a SIGKILL, an empty log)."""
    exit_code: int | None = None
    """The failing rank's exit code as the launcher reported it (negative: killed by that
    signal); None when the tail has no launcher summary."""
    rank: int | None = None
    """The global rank torchrun's Root Cause names."""

    def describe(self) -> str:
        """`rank 0 exited with code 2: <line>`, as far as the tail tells."""
        who = f"rank {self.rank}" if self.rank is not None else "the rank"
        if self.exit_code is not None and self.exit_code < 0:
            how = f"{who} was killed by signal {-self.exit_code}"
        elif self.exit_code is not None:
            how = f"{who} exited with code {self.exit_code}"
        else:
            how = ""
        words = " / ".join(self.lines)
        return ": ".join(part for part in (how, words) if part)


def failure_cause(text: str) -> FailureCause:
    """The failing rank's last error line(s) and exit code, from a log tail or termination
    message that may end with torchrun's summary (pure: the caller has the text)."""
    lines = text.splitlines()
    launcher_at = _launcher_start(lines)
    own = [line for line in lines[:launcher_at] if not _LAUNCHER_LOG.match(line)]
    summary = lines[launcher_at:]
    exit_code, rank = _root_cause(summary)
    if exit_code is None:
        exit_code = _logged_exit(lines)
    words = _last_error(own) or _last_error(_box_traceback(summary)) or _error_named(own)
    return FailureCause(tuple(_bounded(line) for line in words), exit_code, rank)


def _launcher_start(lines: list[str]) -> int:
    """Index of the first line of torchrun's own summary: the traceback that ends in its
    ChildFailedError (or that line itself when the traceback was cut off), else the end."""
    failed = next((i for i in range(len(lines) - 1, -1, -1) if _CHILD_FAILED in lines[i]), None)
    if failed is None:
        return len(lines)
    start = failed
    for i in range(failed - 1, -1, -1):
        line = lines[i]
        if line.startswith(_TRACEBACK):
            return i
        if line and not line.startswith(" "):
            break  # not part of the launcher's traceback: the rank's output ends here
        start = i
    return start


def _root_cause(summary: list[str]) -> tuple[int | None, int | None]:
    """Exit code and rank of the box's Root Cause (the first observed failure)."""
    try:
        at = next(i for i, line in enumerate(summary) if line.startswith("Root Cause"))
    except StopIteration:
        return None, None
    exit_code = rank = None
    for line in summary[at:]:
        if rank is None and (match := _BOX_RANK.match(line)):
            rank = int(match.group(1))
        if exit_code is None and (match := _BOX_EXIT.match(line)):
            exit_code = int(match.group(1))
    return exit_code, rank


def _logged_exit(lines: list[str]) -> int | None:
    """The exit code torchrun logged (`failed (exitcode: 2) local_rank: 0`), when the box
    itself was cut off."""
    for line in reversed(lines):
        if _LAUNCHER_LOG.match(line) and (match := _LOG_EXIT.search(line)):
            return int(match.group(1))
    return None


def _box_traceback(summary: list[str]) -> list[str]:
    """The rank's traceback that a `@record`-decorated entry point left in the box, with
    the box's indentation removed: the words when the rank's own output was cut off."""
    try:
        at = next(i for i, line in enumerate(summary) if "traceback :" in line)
    except StopIteration:
        return []
    first = summary[at].split("traceback :", 1)[1].strip()
    body = [first] + [line[2:] if line.startswith("  ") else line for line in summary[at + 1 :]]
    return [line for line in body if not line.startswith("=")]


def _last_error(lines: list[str]) -> list[str]:
    """The last error the lines hold: an exception ending a traceback (with the rest of its
    message) or an `error:` line, whichever comes later. The traceback's header may have
    been cut off the tail; its indented frames are enough."""
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if _ARGPARSE_ERROR.match(line):
            return [line.strip()]
        if _EXCEPTION.match(line) and _ends_frames(lines, i):
            return _with_message(lines, i)
    return []


def _ends_frames(lines: list[str], i: int) -> bool:
    """Line `i` follows a traceback's frames: indented lines back to a `File "...", line N`,
    or to the start of the tail, which may have cut the traceback's beginning off (its
    first line then is the end of a line cut in the middle)."""
    for k in range(i - 1, -1, -1):
        line = lines[k]
        if _FRAME.match(line):
            return True
        if not line.startswith(" "):
            return k == 0 and i > 1
    return i > 0


def _error_named(lines: list[str]) -> list[str]:
    """The last line that starts with an error's name (`SomethingError: ...`), for a tail
    that kept the exception but nothing of its traceback."""
    for line in reversed(lines):
        if _NAMED_ERROR.match(line):
            return [line.strip()]
    return []


def _with_message(lines: list[str], at: int) -> list[str]:
    """The exception line and the lines of its message that follow it."""
    message = [lines[at].strip()]
    for line in lines[at + 1 : at + LINES_MAX]:
        ends = not line.strip() or line.startswith((_TRACEBACK, " ", "===", "---"))
        if ends or _LAUNCHER_LOG.match(line):
            break
        message.append(line.strip())
    return message


def _bounded(line: str) -> str:
    return line if len(line) <= LINE_MAX else line[: LINE_MAX - 3] + "..."
