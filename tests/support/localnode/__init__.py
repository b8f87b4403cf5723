"""A local node for tests and the demo: pods of a real control plane run as real processes.

Test and demo support, not a product feature; see docs/local-node.md.
"""

from support.localnode.cluster import LocalCluster
from support.localnode.context import Backoff

__all__ = ["Backoff", "LocalCluster"]
