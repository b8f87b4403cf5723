"""The HF Trainer example heals: a poisoned stretch of data spikes the loss, the operator rolls
back, the Trainer resumes from the chosen step (its own resume_from_checkpoint) with the
directives' LR scale, and the skipped data is never read again.
"""

from __future__ import annotations

import pytest

from support.frameworks import ExampleLogs, check_healed, example_manifest
from support.localnode import LocalCluster
from support.operator import Jobs


@pytest.mark.usefixtures("operator")
def test_hf_trainer_example_heals(
    jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    jobs.create(example_manifest("hf-trainer", "hf"))
    logs = ExampleLogs(local_cluster.shared_dir, job_namespace, "hf-trainer-log")
    entry = check_healed(jobs, "hf", logs)
    print(
        f"\nrolled back from {entry['fromStep']} to {entry['toStep']}, skipped {entry['skipped']}"
    )
