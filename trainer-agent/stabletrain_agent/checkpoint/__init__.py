"""Checkpoint tiers: node-local NVMe for fast restarts, the PFS for survival of a lost node,
and the pod's memory for the newest state between two saves (kept across a restart of the
training processes inside the pod).

This package root imports nothing, so a process in the pod that scans the tiers while
training is down (the supervisor) can import the torch-free modules (layout, manifest,
signing, fence, inventory_scan, memory_tier, replicate) without pulling in torch; only
`manager`, `snapshot`, `states` and `safe_load` need it. What the operator decides on
(selection, retention, the inventory merge) is `stabletrain_contract.checkpoint`.
"""
