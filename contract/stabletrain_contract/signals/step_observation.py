"""What one finished optimizer step looked like, as every signal reads it.

Its own module because every signal module reads it and the monitor imports every signal
module: living in the monitor it would make each new signal import its own caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple


class StepObservation(NamedTuple):
    """What one finished optimizer step looked like, in values all ranks agree on.

    Built with keywords, and the restart/save facts have no defaults: a forgotten
    ``steps_since_start`` would read as "just restarted" forever and silence the
    throughput detector. A tuple: one is built on every step, where a frozen dataclass
    costs several times more.
    """

    step: int
    """Global optimizer step just finished."""
    loss: float
    """Loss averaged across all ranks; may be nan or inf."""
    grad_norm: float | None
    """Total pre-clip grad norm across all ranks; None when the loop does not clip."""
    lr: float
    """Effective LR of param group 0 after directives were applied."""
    tokens_per_second: float | None
    """Throughput of this step; None when the loop does not report token counts."""
    checkpoint_in_flight: bool
    """A save ran during this step, so a throughput dip is expected and not a fault."""
    steps_since_start: int
    """Steps since this process (re)started, 0 on the first; those are slow while caches warm."""
    custom: Mapping[str, float] = MappingProxyType({})
    """Named custom signals (validation loss, MoE aux loss, entropy, ...)."""
