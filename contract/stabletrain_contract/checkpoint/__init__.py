"""Checkpoints as both sides see them: the records of the inventory, the settings a pod
saves with, and the decisions made on them (which copy a restore takes, how many copies
retention keeps, how the pods' inventories merge). The agent's tiers themselves (writing,
verifying, scanning, restoring) are `stabletrain_agent.checkpoint`.
"""
