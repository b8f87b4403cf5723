"""kopf handlers, one module per concern; importing this package registers them all
(settings first: its startup handler makes the API client the others use)."""

from stabletrain_operator.handlers import settings  # isort: skip
from stabletrain_operator.handlers import jobs, pod_index, policies, wakeups

__all__ = ["jobs", "pod_index", "policies", "settings", "wakeups"]
