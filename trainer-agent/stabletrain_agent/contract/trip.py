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

from typing import Literal

from pydantic import AwareDatetime, Field, ValidationError, field_validator

from stabletrain_agent.contract.base import ContractError, ContractModel, describe_errors
from stabletrain_agent.contract.inventory import NODE_NAME_MAX, CompactCheckpoint
from stabletrain_agent.contract.names import AnomalyClass, is_signal_name

TERMINATION_MESSAGE_LIMIT = 4096
"""Bytes of a termination message the kubelet keeps; anything longer is cut mid-JSON."""
EVIDENCE_MAX = 512
LINEAGE_PATH_MAX = 512
FIRING_MAX = 16
_ELLIPSIS = "..."


class TripReport(ContractModel):
    """Why training stopped, with what the operator needs to plan the rollback."""

    schema_version: Literal[1] = 1
    attempt: int = Field(ge=0)
    node: str = Field(min_length=1, max_length=NODE_NAME_MAX)
    step: int = Field(ge=0)
    """Step at which every rank stopped."""
    tripped_at: AwareDatetime
    signal: str
    """The signal that tripped (the first, when several tripped on the same step)."""
    anomaly_class: AnomalyClass
    evidence: str = Field(default="", max_length=EVIDENCE_MAX)
    """One or two sentences a person can check: values, baseline, why this class."""
    value: float | None = None
    """Observed value that crossed the threshold (may be NaN for NonFinite)."""
    threshold: float | None = None
    onset_step: int = Field(ge=0)
    """First step of the anomalous run; skip ranges are placed around it."""
    last_good_step: int | None = Field(default=None, ge=0)
    """Last step judged healthy before the onset; null if none was judged yet."""
    firing: tuple[str, ...] = Field(default=(), max_length=FIRING_MAX)
    """Every signal firing at `step` (tripping or not), for rules with compound conditions."""
    inventory: tuple[CompactCheckpoint, ...] = ()
    """This node's checkpoints, oldest first, in the compact `[step, attempt, flags]` form."""
    inventory_omitted: int = Field(default=0, ge=0)
    """Older entries left out to fit the 4 KiB message; the full list is on the PFS."""
    lineage_path: str = Field(default="", max_length=LINEAGE_PATH_MAX)
    """PFS path of the full spike-window lineage (which shards/samples each step consumed)."""

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

    Drops the oldest inventory entries (counting them in `inventoryOmitted`), then shortens
    the evidence, then the list of co-firing signals. The field bounds guarantee the report
    fits after that; a ValueError would mean those bounds were loosened without care.
    """
    if _size(report) <= TERMINATION_MESSAGE_LIMIT:
        return report.model_dump_json()
    inventory = sorted(report.inventory)
    omitted = report.inventory_omitted
    low, high = 0, len(inventory)
    # Fewest entries to drop so the rest fits: the size only shrinks as more are dropped.
    while low < high:
        drop = (low + high) // 2
        trial = report.model_copy(
            update={"inventory": tuple(inventory[drop:]), "inventory_omitted": omitted + drop}
        )
        if _size(trial) <= TERMINATION_MESSAGE_LIMIT:
            high = drop
        else:
            low = drop + 1
    fitted = report.model_copy(
        update={"inventory": tuple(inventory[low:]), "inventory_omitted": omitted + low}
    )
    evidence = fitted.evidence
    while _size(fitted) > TERMINATION_MESSAGE_LIMIT and evidence:
        evidence = evidence[: len(evidence) // 2]
        fitted = fitted.model_copy(update={"evidence": evidence + _ELLIPSIS})
    if _size(fitted) > TERMINATION_MESSAGE_LIMIT:
        fitted = fitted.model_copy(update={"evidence": "", "firing": (fitted.signal,)})
    message = fitted.model_dump_json()
    if len(message.encode()) > TERMINATION_MESSAGE_LIMIT:
        raise ValueError("trip report cannot fit the termination message; check field bounds")
    return message


def parse_termination_message(message: str | bytes) -> TripReport:
    """The operator side: a TripReport, or ContractError naming each bad field."""
    try:
        return TripReport.model_validate_json(message)
    except ValidationError as error:
        raise ContractError(describe_errors("trip report", error)) from None
