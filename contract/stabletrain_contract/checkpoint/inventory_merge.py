"""One inventory out of many: what each pod saw of the tiers, combined for a decision.

Each pod reports only what it can see (its node's local tier, its own memory, the shared
PFS); the operator decides on the union. The merge lives in the contract because the
operator decides with it and the tests of the agent's scan check their records with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from stabletrain_contract.checkpoint.inventory import CheckpointRecord


def merge_records(reports: Iterable[Sequence[CheckpointRecord]]) -> list[CheckpointRecord]:
    """Combine the nodes' reports into one inventory (what the operator decides on).

    Local copies are the union of what each node saw of its own tier, memory copies the
    union of what each pod saw of its own memory.  The PFS counts as
    complete if any node saw it complete: the PFS only gains parts until retention, and a
    restore re-verifies before it trusts anything, so optimism here costs no correctness.
    """
    merged: dict[tuple[int, int], CheckpointRecord] = {}
    for report in reports:
        for record in report:
            key = (record.step, record.attempt)
            seen = merged.get(key)
            if seen is None:
                merged[key] = record
                continue
            local = {copy.node: copy for copy in (*seen.local, *record.local)}
            memory = {copy.pod: copy for copy in (*seen.memory, *record.memory)}
            pfs = seen.pfs if seen.pfs.verified else record.pfs
            merged[key] = seen.model_copy(
                update={
                    "local": tuple(local[name] for name in sorted(local)),
                    "memory": tuple(memory[name] for name in sorted(memory)),
                    "pfs": pfs,
                }
            )
    return [merged[key] for key in sorted(merged)]
