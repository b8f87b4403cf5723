"""What the operator and the pods must agree on: the one package both sides import.

The operator imports nothing else of the agent's, and the agent nothing of the operator's;
this package imports neither of them, nor torch, nor kopf (`make lint` holds all three).
Someone editing a module here is changing both sides at once.

Where things are:

- the ground: `base` (the pydantic configuration of every model), `names` (signals,
  attribution classes, actions), `env` (environment variables and default paths);
- what crosses the wire: `directives` (what the operator hands a run), `channel` (the
  status endpoint and live directives), `trip_report` (the 4 KiB reason a run stopped),
  `preflight`, `supervisor`, `restore`, `completion`;
- detection: `detection` and `trip_rules` (thresholds, as the spec writes them) and
  `signals` (the per-step detectors the agent runs and `stabletrain replay` re-runs);
- `checkpoint`: the inventory's records, the checkpoint settings, how a restore point is
  selected, how many copies retention keeps, and how the pods' inventories are merged.

Version skew. The operator is upgraded by the platform team and the agent with each
training image, so the two may be of different releases (docs/operations.md, "Version
skew"). The rule: what crosses the wire only grows. A field is added, never removed,
renamed or retyped; a new field is optional and its absence means the old behaviour; a
default never changes; the values an agent reports stay as they are. What an agent sends
ignores unknown fields (`base.AgentReport`); what the operator sends refuses them.
tests/integration/skew holds what agents of older commits sent and accepted, and the skew
tests check today's models against it.
"""

__version__ = "0.1.0"
"""The release of stabletrain, read by the packaging (pyproject.toml): the rule above and
docs/operations.md's supported versions are stated against it."""
