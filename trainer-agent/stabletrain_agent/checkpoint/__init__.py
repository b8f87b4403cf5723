"""Two-tier checkpoints: node-local NVMe for fast restarts, the PFS for survival of a lost node.

This package root imports nothing, so the operator can import the torch-free modules
(layout, manifest, signing, fence, inventory, retention, selection, replicate) without
pulling in torch; only `manager`, `states` and `safe_load` need it.
"""
