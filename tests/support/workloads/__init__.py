"""Small training workloads that pods of the local node run under torchrun in operator tests."""
