"""kopf handlers, one module per concern; importing this package registers them all."""

from stabletrain_operator.handlers import jobs, pod_index, settings, wakeups

__all__ = ["jobs", "pod_index", "settings", "wakeups"]
