"""Kueue integration: a job with the kueue.x-k8s.io/queue-name label runs only while Kueue
admits its Workload (docs/operations.md, "Running with Kueue")."""
