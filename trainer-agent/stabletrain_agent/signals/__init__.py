"""Torch-free per-step detectors: baselines, spikes, non-finite values, throughput, attribution."""
