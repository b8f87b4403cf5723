"""Reading a recorded metrics history (CSV) into rows the monitor can observe.

Training logs come from many loggers, so the format is lenient where loggers differ
(sparse rows, `nan`/`inf` spelled either way, an empty loss cell for NaN as pandas writes
it, `1200.0` for a step) and strict where a silent guess would change the verdict: a step
that is not an integer, a value that is not a number, time running backwards. Every error
names the file, the line and the column.

A run that healed itself logs a step sequence that goes back: after a rollback
the next attempt resumes from a checkpoint before the spike. Such a row starts a new
attempt (a relaunch). An `attempt` column, when present, says so explicitly, and then a
step that does not increase within one attempt is an error.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from stabletrain_contract.names import CUSTOM_NAME_PATTERN
from stabletrain_operator.cli.errors import USAGE_EXIT, CliError

STEP = "step"
LOSS = "loss"
GRAD_NORM = "grad_norm"
LR = "lr"
TOKENS_PER_SECOND = "tokens_per_second"
ATTEMPT = "attempt"
TIME = "time"
BUILT_IN_COLUMNS = (STEP, LOSS, GRAD_NORM, LR, TOKENS_PER_SECOND, ATTEMPT, TIME)
_CUSTOM_COLUMN = re.compile(CUSTOM_NAME_PATTERN)


@dataclass(frozen=True)
class MetricsRow:
    """One logged step; None where the logger wrote nothing for an optional column."""

    line: int
    step: int
    loss: float
    """NaN when the cell said nan or was empty (pandas writes NaN as an empty cell)."""
    grad_norm: float | None
    lr: float | None
    tokens_per_second: float | None
    custom: Mapping[str, float] = field(default_factory=dict)
    time: float | None = None
    """Seconds (any origin, e.g. Unix time) when the step finished, if logged."""
    relaunch: bool = False
    """First row of a new attempt: the run was relaunched from a checkpoint before it."""


@dataclass(frozen=True)
class MetricsHistory:
    """The parsed file: rows in logged order and the custom columns it carries."""

    path: Path
    rows: tuple[MetricsRow, ...]
    custom_columns: tuple[str, ...]

    @property
    def relaunches(self) -> int:
        return sum(row.relaunch for row in self.rows)


def read_history(path: Path) -> MetricsHistory:
    """Parse `path`; CliError (exit 2) names the file, line and column of the first problem."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            return _parse(path, handle)
    except FileNotFoundError:
        raise CliError(f"{path}: no such file", exit_code=USAGE_EXIT) from None
    except IsADirectoryError:
        raise CliError(f"{path}: is a directory, not a CSV file", exit_code=USAGE_EXIT) from None
    except UnicodeDecodeError as error:
        raise CliError(
            f"{path}: not UTF-8 text (byte {error.start}); export the metrics as CSV",
            exit_code=USAGE_EXIT,
        ) from None


def _parse(path: Path, handle: TextIO) -> MetricsHistory:
    reader = csv.reader(handle)
    try:
        return _parse_rows(path, reader, lambda: reader.line_num)
    except csv.Error as error:
        raise _error(path, reader.line_num, None, f"malformed CSV: {error}") from None


@dataclass
class _Sequence:
    """What the previous row said about step, attempt and time."""

    step: int | None = None
    attempt: int | None = None
    time: float | None = None


def _parse_rows(
    path: Path, reader: Iterator[list[str]], line_number: Callable[[], int]
) -> MetricsHistory:
    """`line_number` is the reader's physical line (quoted cells may span lines)."""
    header = _header(path, next(reader, None))
    custom_columns = tuple(name for name in header if name not in BUILT_IN_COLUMNS)
    rows: list[MetricsRow] = []
    previous = _Sequence()
    for cells in reader:
        line = line_number()
        if not any(cell.strip() for cell in cells):
            continue
        if len(cells) != len(header):
            raise _error(path, line, None, f"{len(cells)} fields, but the header has {len(header)}")
        values = dict(zip(header, (cell.strip() for cell in cells), strict=True))
        step = _integer(path, line, STEP, values[STEP])
        attempt = None if ATTEMPT not in values else _integer(path, line, ATTEMPT, values[ATTEMPT])
        time = _optional(path, line, TIME, values)
        relaunch = _relaunch(path, line, previous, _Sequence(step, attempt, time))
        previous = _Sequence(step, attempt, time if time is not None else previous.time)
        custom = {}
        for name in custom_columns:
            value = _number(path, line, name, values[name])
            if value is not None:
                custom[name] = value
        loss = _number(path, line, LOSS, values[LOSS])
        rows.append(
            MetricsRow(
                line=line,
                step=step,
                loss=math.nan if loss is None else loss,
                grad_norm=_optional(path, line, GRAD_NORM, values),
                lr=_optional(path, line, LR, values),
                tokens_per_second=_optional(path, line, TOKENS_PER_SECOND, values),
                custom=custom,
                time=time,
                relaunch=relaunch,
            )
        )
    if not rows:
        raise _error(path, 2, None, "no data rows after the header")
    return MetricsHistory(path=path, rows=tuple(rows), custom_columns=custom_columns)


def _relaunch(path: Path, line: int, previous: _Sequence, current: _Sequence) -> bool:
    """Whether this row starts a new attempt; errors for sequences no run can produce."""
    step, attempt, time = current.step, current.attempt, current.time
    assert step is not None  # every row has a step
    if time is not None and not math.isfinite(time):
        raise _error(path, line, TIME, f"time {time} is not a finite number of seconds")
    if time is not None and previous.time is not None and time < previous.time:
        raise _error(
            path, line, TIME, f"time {time:g} is before the previous row's {previous.time:g}"
        )
    if previous.step is None:
        return False
    if attempt is None:
        return step <= previous.step
    assert previous.attempt is not None  # the column is present on every row or none
    if attempt < previous.attempt:
        raise _error(path, line, ATTEMPT, f"attempt {attempt} follows attempt {previous.attempt}")
    if attempt == previous.attempt and step <= previous.step:
        raise _error(
            path,
            line,
            STEP,
            f"step {step} does not follow step {previous.step} within attempt {attempt}",
        )
    return attempt > previous.attempt


def _header(path: Path, cells: list[str] | None) -> tuple[str, ...]:
    if cells is None:
        raise _error(path, 1, None, "empty file; expected a header such as step,loss")
    names = tuple(cell.strip().lstrip("\ufeff").lower() for cell in cells)
    for required in (STEP, LOSS):
        if required not in names:
            raise _error(
                path, 1, None, f"header has no {required!r} column (found: {', '.join(names)})"
            )
    seen: set[str] = set()
    for name in names:
        if not name:
            raise _error(path, 1, None, "a column has no name (a trailing comma?)")
        if name in seen:
            raise _error(path, 1, name, "column appears twice in the header")
        seen.add(name)
        if name not in BUILT_IN_COLUMNS and not _CUSTOM_COLUMN.fullmatch(name):
            raise _error(
                path,
                1,
                name,
                f"not a built-in column ({', '.join(BUILT_IN_COLUMNS)}) nor a custom "
                f"signal metric name ({CUSTOM_NAME_PATTERN})",
            )
    return names


def _integer(path: Path, line: int, column: str, cell: str) -> int:
    """A non-negative integer; `1200.0` too, since pandas writes integer columns that way."""
    try:
        number = float(cell)
    except ValueError:
        raise _error(path, line, column, f"{cell!r} is not an integer {column}") from None
    if not number.is_integer():
        raise _error(path, line, column, f"{cell!r} is not an integer {column}")
    value = int(number)
    if value < 0:
        raise _error(path, line, column, f"{column} {value} is negative")
    return value


def _number(path: Path, line: int, column: str, cell: str) -> float | None:
    """A float; `nan`, `inf`, `-inf` in any case; None for an empty cell."""
    if not cell:
        return None
    try:
        return float(cell)
    except ValueError:
        raise _error(path, line, column, f"{cell!r} is not a number") from None


def _optional(path: Path, line: int, column: str, values: Mapping[str, str]) -> float | None:
    cell = values.get(column)
    return None if cell is None else _number(path, line, column, cell)


def _error(path: Path, line: int, column: str | None, problem: str) -> CliError:
    where = f"{path}:{line}" + ("" if column is None else f": column {column}")
    return CliError(f"{where}: {problem}", exit_code=USAGE_EXIT)
