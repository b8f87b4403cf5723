"""Torch-free per-step detectors: baselines, spikes, non-finite values, throughput, attribution.

Two layers, so the hygiene every detector needs is written once:

* ``detector.Detector`` owns a series' healthy baseline, its run of anomalous steps, live
  retuning and checkpointed state; ``SpikeDetector``, ``ThroughputDetector`` and
  ``CustomDetector`` only say how one value is judged.
* ``monitored.MonitoredSignal`` is what ``SignalMonitor`` runs: where a signal's value comes
  from in a step, how its finding reads, and its keys of the saved state.

A new built-in signal is one module holding both (its detector and its ``MonitoredSignal``)
plus one entry in ``SignalMonitor``'s list; its name, thresholds and defaults go in
``names.Signal`` and ``names.AGENT_SIGNALS`` and ``detection.DetectionConfig`` like any API
(tests/unit/signals/test_signal_registry.py fails for a forgotten one). A job's own signal
needs none of that: the loop passes its detector to the Guard (docs/policy.md).
"""
