"""Torch-free schemas where the agent and the operator meet.

The operator imports them; the agent never imports the operator. Modules: `names`
(signals, attribution classes, actions), `detection` (thresholds and their arithmetic),
`directives` (what the operator hands to a run), `inventory` (checkpoints per tier),
`trip` (the 4 KiB trip report), `channel` (live directives and the status endpoint over
HTTP), `env` (environment variable names and default paths).
"""
