"""Chaos: faults of every kind injected into a running job, and the harness that measures them."""
