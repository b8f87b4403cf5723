"""The trip report: what the agent leaves behind when it stops training on purpose.

torchrun exits 1 whenever any worker fails, whatever the worker's own exit code, so an exit
code cannot carry the reason. One process per pod writes this report to the path the pod's
`STABLETRAIN_TERMINATION_MESSAGE_PATH` names (the container's terminationMessagePath), and
the kubelet copies at most 4096 bytes of it into the pod status, where the operator's pod
watch reads it within a second. The report therefore must fit 4 KiB: the serialiser drops
the oldest inventory entries first (the newest are the rollback candidates), then shortens
the evidence, and always produces complete JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import AwareDatetime, Field, ValidationError, field_validator

from stabletrain_contract.base import AgentReport, ContractError, describe_errors
from stabletrain_contract.checkpoint.inventory import (
    INVENTORY_MAX,
    NODE_NAME_MAX,
    POD_NAME_MAX,
    CompactCheckpoint,
)
from stabletrain_contract.directives import SHARD_ID_MAX
from stabletrain_contract.names import SIGNAL_NAME_MAX, AnomalyClass, is_signal_name

TERMINATION_MESSAGE_LIMIT = 4096
"""Bytes of a termination message the kubelet keeps; anything longer is cut mid-JSON."""
EVIDENCE_MAX = 512
LINEAGE_PATH_MAX = 512
FIRING_MAX = 16
SUSPECT_SHARDS_MAX = 256
INVENTORY_KEPT_FIRST = 8
"""Newest inventory entries kept before suspect shards are cut: the rollback target is
almost always among them."""
_ELLIPSIS = "..."


class TripReport(AgentReport):
    """Why training stopped, with what the operator needs to plan the rollback."""

    schema_version: Literal[1] = 1
    """Bumped on incompatible changes, so an old operator can say what it cannot read."""
    attempt: int = Field(ge=0)
    """Attempt that tripped: a report of an older attempt is stale."""
    node: str = Field(min_length=1, max_length=NODE_NAME_MAX)
    """Node of the pod that wrote the report (its inventory is that view)."""
    pod: str | None = Field(default=None, min_length=1, max_length=POD_NAME_MAX)
    """The pod that wrote it: the inventory's memory flags are its memory tier's."""
    step: int = Field(ge=0)
    """Step at which every rank stopped."""
    tripped_at: AwareDatetime
    """When the ranks agreed to stop."""
    signal: str = Field(max_length=SIGNAL_NAME_MAX)
    """The signal that tripped (the first, when several tripped on the same step)."""
    anomaly_class: AnomalyClass
    evidence: str = Field(default="", max_length=EVIDENCE_MAX)
    """One or two sentences a person can check: values, baseline, why this class."""
    value: float | None = None
    """Observed value that crossed the threshold (may be NaN for NonFinite)."""
    threshold: float | None = None
    """The bound it crossed, in the unit of `value`."""
    onset_step: int = Field(ge=0)
    """First step of the anomalous run; skip ranges are placed around it."""
    last_good_step: int | None = Field(default=None, ge=0)
    """Last step judged healthy before the onset; null if none was judged yet."""
    firing: tuple[Annotated[str, Field(max_length=SIGNAL_NAME_MAX)], ...] = Field(
        default=(), max_length=FIRING_MAX, fail_fast=True
    )
    """Every signal firing at `step` (tripping or not), for rules with compound conditions."""
    inventory: tuple[CompactCheckpoint, ...] = Field(
        default=(), max_length=INVENTORY_MAX, fail_fast=True
    )
    """This node's newest checkpoints, oldest first, in the compact `[step, attempt, flags]`
    form."""
    inventory_omitted: int = Field(default=0, ge=0)
    """Older entries left out (beyond the newest 64, or to fit the 4 KiB message); the PFS
    holds them all."""
    lineage_path: str = Field(default="", max_length=LINEAGE_PATH_MAX)
    """PFS path of the full spike-window lineage (which shards/samples each step consumed)."""
    suspect_shards: tuple[Annotated[str, Field(min_length=1, max_length=SHARD_ID_MAX)], ...] = (
        Field(default=(), max_length=SUSPECT_SHARDS_MAX, fail_fast=True)
    )
    """Shards consumed from shortly before the onset to the trip, most suspect first: what
    a rollback's skip range may be narrowed to (SkipRange.shardIds)."""
    suspect_shards_omitted: int = Field(default=0, ge=0)
    """Trailing suspect shards left out to fit 4 KiB; the lineage file lists them all."""
    directives_generation: int | None = Field(default=None, ge=0)
    """Generation of the directives the ranks ran when they tripped (their trip list):
    the operator decides the trip by the policy of that generation, so an edit racing the
    trip is not applied to a stop the old policy made. Null from an older agent."""

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, name: str) -> str:
        if not is_signal_name(name):
            raise ValueError(f"{name!r} is not a signal name")
        return name

    @field_validator("firing")
    @classmethod
    def _known_signals(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            cls._known_signal(name)
        return names


def _size(report: TripReport) -> int:
    return len(report.model_dump_json().encode())


def render_termination_message(report: TripReport) -> str:
    """JSON of `report` in at most 4096 UTF-8 bytes, degrading instead of failing.

    In order, until it fits: the oldest inventory entries down to the newest
    INVENTORY_KEPT_FIRST, the least suspect shards, the rest of the inventory, the evidence
    text, the co-firing signals. Dropped entries are counted in the `...Omitted` fields and
    remain in the lineage file on the PFS. The field bounds guarantee a fit after that; a
    ValueError would mean those bounds were loosened without care.
    """
    fitted = report.model_copy(update={"inventory": tuple(sorted(report.inventory))})
    fitted = _drop_oldest_inventory(fitted, keep_at_least=INVENTORY_KEPT_FIRST)
    fitted = _drop_least_suspect_shards(fitted)
    fitted = _drop_oldest_inventory(fitted, keep_at_least=0)
    evidence = fitted.evidence
    while not _fits(fitted) and evidence:
        evidence = evidence[: len(evidence) // 2]
        fitted = fitted.model_copy(update={"evidence": evidence + _ELLIPSIS})
    if not _fits(fitted):
        fitted = fitted.model_copy(update={"evidence": "", "firing": (fitted.signal,)})
    if not _fits(fitted):
        raise ValueError("trip report cannot fit the termination message; check field bounds")
    return fitted.model_dump_json()


def _fits(report: TripReport) -> bool:
    return len(report.model_dump_json().encode()) <= TERMINATION_MESSAGE_LIMIT


def _fewest_to_drop(count: int, fits_after_dropping: Callable[[int], bool]) -> int:
    """Smallest n in [0, count] with fits_after_dropping(n); size only shrinks as n grows."""
    low, high = 0, count
    while low < high:
        middle = (low + high) // 2
        if fits_after_dropping(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _drop_oldest_inventory(report: TripReport, keep_at_least: int) -> TripReport:
    inventory = report.inventory

    def dropped(n: int) -> TripReport:
        return report.model_copy(
            update={
                "inventory": inventory[n:],
                "inventory_omitted": report.inventory_omitted + n,
            }
        )

    droppable = max(len(inventory) - keep_at_least, 0)
    return dropped(_fewest_to_drop(droppable, lambda n: _fits(dropped(n))))


def _drop_least_suspect_shards(report: TripReport) -> TripReport:
    shards = report.suspect_shards

    def dropped(n: int) -> TripReport:
        return report.model_copy(
            update={
                "suspect_shards": shards[: len(shards) - n],
                "suspect_shards_omitted": report.suspect_shards_omitted + n,
            }
        )

    return dropped(_fewest_to_drop(len(shards), lambda n: _fits(dropped(n))))


def parse_termination_message(message: str | bytes) -> TripReport:
    """The operator side: a TripReport, or ContractError naming each bad field."""
    try:
        return TripReport.model_validate_json(message)
    except ValidationError as error:
        raise ContractError(describe_errors("trip report", error)) from None
