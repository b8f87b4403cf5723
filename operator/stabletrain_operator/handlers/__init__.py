"""kopf handlers, one module per concern; importing this package registers them all
(startup first: its handler makes the API client the others use)."""

from stabletrain_operator.handlers import startup  # isort: skip
from stabletrain_operator.handlers import jobs, live_body, pod_index, policies, wakeups

__all__ = ["jobs", "live_body", "pod_index", "policies", "startup", "wakeups"]
