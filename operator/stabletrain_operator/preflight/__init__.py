"""The stability preflight: the run's start-up facts against known causes of spikes and lost
work (checklist.py, pure), the Preflight condition (conditions/preflight_condition.py, pure)
and the preflight pod of jobs that refuse to start on a severe finding (preflight_pod.py).
docs/preflight.md has the list."""
