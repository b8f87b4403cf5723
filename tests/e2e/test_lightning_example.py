"""The Lightning example heals: a poisoned stretch of data spikes the loss, the operator rolls
back, Lightning resumes from the chosen step through the stabletrain plugin with the
directives' LR scale, and the skipped data is never read again.
"""

from __future__ import annotations

import pytest

from support.frameworks import ExampleLogs, check_healed, example_manifest
from support.localnode import LocalCluster
from support.operator import Jobs


@pytest.mark.usefixtures("operator")
def test_lightning_example_heals(
    jobs: Jobs, job_namespace: str, local_cluster: LocalCluster
) -> None:
    jobs.create(example_manifest("lightning", "lit"))
    logs = ExampleLogs(local_cluster.shared_dir, job_namespace, "lightning-log")
    entry = check_healed(jobs, "lit", logs)
    print(
        f"\nrolled back from {entry['fromStep']} to {entry['toStep']}, skipped {entry['skipped']}"
    )
