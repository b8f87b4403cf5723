"""The trip report a tripping verdict makes: the one builder of the agent and the replay.

The agent sends it when its run trips; `stabletrain replay` builds the same report from a
recorded log, so what a replay shows is what the operator would have been told.
"""

from __future__ import annotations

from datetime import UTC, datetime

from stabletrain_contract.checkpoint.inventory import INVENTORY_MAX, CompactCheckpoint
from stabletrain_contract.names import AnomalyClass
from stabletrain_contract.signals.monitor import Finding, Verdict
from stabletrain_contract.trip_report import EVIDENCE_MAX, SUSPECT_SHARDS_MAX, TripReport


def build_trip_report(
    verdict: Verdict,
    *,
    attempt: int,
    node: str,
    last_good_step: int | None,
    pod: str | None = None,
    inventory: tuple[CompactCheckpoint, ...],
    lineage_path: str,
    suspect_shards: tuple[str, ...] = (),
    directives_generation: int | None = None,
) -> TripReport:
    """The contract's report for a tripping verdict; the first tripping finding leads. Of
    `inventory` (oldest first) the newest INVENTORY_MAX entries are kept, the rest counted."""
    if not verdict.tripping:
        raise ValueError(f"verdict of step {verdict.step} does not trip; nothing to report")
    lead: Finding = verdict.tripping[0]
    firing = tuple(dict.fromkeys(f.signal for f in verdict.findings))
    return TripReport(
        attempt=attempt,
        node=node,
        pod=pod,
        step=verdict.step,
        tripped_at=datetime.now(UTC),
        signal=lead.signal,
        anomaly_class=AnomalyClass(lead.anomaly_class),
        evidence=lead.evidence[:EVIDENCE_MAX],
        value=lead.value,
        threshold=lead.threshold,
        onset_step=lead.onset_step,
        last_good_step=last_good_step,
        firing=firing[:16],
        inventory=inventory[-INVENTORY_MAX:],
        inventory_omitted=max(0, len(inventory) - INVENTORY_MAX),
        lineage_path=lineage_path,
        suspect_shards=suspect_shards[:SUSPECT_SHARDS_MAX],
        suspect_shards_omitted=max(0, len(suspect_shards) - SUSPECT_SHARDS_MAX),
        directives_generation=directives_generation,
    )
