"""Test and demo support: the real control plane, its fixtures and (later) the local node."""
