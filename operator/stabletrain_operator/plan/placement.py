"""The job's suspect nodes: remembered per incident, expired, and kept away from.

Bounded (SUSPECT_NODES_MAX, the oldest incident drops off) and expiring
(recovery.placement.suspectSeconds after a node's last incident), so a node that was
repaired, or merely unlucky once, is used again later. The list lives in status, so
`kubectl get stj -o yaml` and `stabletrain status` show it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from stabletrain_operator.api.spec import PlacementSpec, SuspectPlacement
from stabletrain_operator.api.status import SUSPECT_NODES_MAX, Suspect, SuspectNode


def unexpired(nodes: Sequence[SuspectNode], now: datetime) -> tuple[SuspectNode, ...]:
    return tuple(n for n in nodes if n.expires_at > now)


def remember_suspects(
    nodes: Sequence[SuspectNode],
    suspects: Sequence[Suspect],
    placement: PlacementSpec,
    *,
    now: datetime,
) -> tuple[tuple[SuspectNode, ...], list[str]]:
    """The list after one incident, and a sentence per node it names (for the Events)."""
    by_node = {n.node: n for n in unexpired(nodes, now)}
    messages: list[str] = []
    expires = now + timedelta(seconds=placement.suspect_seconds)
    for suspect in suspects:
        if not suspect.avoid or not suspect.node:
            continue
        known = by_node.pop(suspect.node, None)
        count = 1 if known is None else known.incidents + 1
        lost = (0 if known is None else known.node_lost_incidents) + int(suspect.node_lost)
        by_node[suspect.node] = SuspectNode(
            node=suspect.node,
            incidents=count,
            node_lost_incidents=lost,
            last_reason=suspect.reason,
            last_incident_at=now,
            expires_at=expires,
        )
        messages.append(
            f"node {suspect.node} is suspect ({count} incident(s) of this job): {suspect.reason}"
        )
    ordered = sorted(by_node.values(), key=lambda n: n.last_incident_at)
    return tuple(ordered[-SUSPECT_NODES_MAX:]), [m[:1024] for m in messages]


def avoided_nodes(
    nodes: Sequence[SuspectNode], placement: PlacementSpec
) -> tuple[tuple[str, ...], bool]:
    """The nodes a relaunch keeps away from, and whether it may require it (Avoid) or
    only prefer it (PreferAway)."""
    if placement.suspects is SuspectPlacement.IGNORE:
        return (), False
    return tuple(sorted(n.node for n in nodes)), placement.suspects is SuspectPlacement.AVOID
