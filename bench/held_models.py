"""What the operator holds of each job's parsed spec and status, with equal policy parts
shared between jobs (api/shared.py) and without, side by side in one run.

Each job is read as the API server gives it (its own JSON, decoded anew), validated as the
daemon does (jobview.parse: the spec as written, the status with the job's name), held,
and its models given the shared field-name sets (shared_field_names.py) as after a tick.
The jobs are those of bench/operator_scale.py: one manifest, one policy, and status.policy
as the operator writes it. tracemalloc counts what the held models keep.

    PYTHONPATH=tests .venv/bin/python bench/held_models.py [--jobs 1000]
"""

from __future__ import annotations

import argparse
import gc
import json
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from stabletrain_contract.base import AS_WRITTEN
from stabletrain_operator.api import shared
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.plan.rollout import record_of
from stabletrain_operator.platform_policy.effective import effective_policy
from stabletrain_operator.shared_field_names import share_field_names
from support.operator import job_manifest

Json = dict[str, Any]


def stored_job(name: str) -> str:
    """The job as JSON: bench/operator_scale.py's manifest and the status the operator
    writes for it (its phase, attempt and policy in force)."""
    spec = job_manifest(name, {}, nodes=4, recovery={"restart": "InPlace"})["spec"]
    parsed = StableTrainingJobSpec.model_validate(spec)
    effective = effective_policy(parsed, ())
    assert effective.spec is not None
    record = record_of(effective, effective.spec, generation=1, directives_generation=1)
    status = StableTrainingJobStatus(phase="Running", attempt=1, policy=record)
    dumped = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    return json.dumps({"metadata": {"name": name}, "spec": spec, "status": dumped})


@contextmanager
def sharing(enabled: bool) -> Iterator[None]:
    """Without sharing, every input is validated on its own, as before api/shared.py."""
    kept: Callable[..., Any] = shared._validate_shared
    if not enabled:
        shared._validate_shared = lambda source, value, handler, info: handler(value)
    try:
        yield
    finally:
        shared._validate_shared = kept


def held_bytes(texts: list[str], *, enabled: bool) -> int:
    gc.collect()
    tracemalloc.start()
    with sharing(enabled):
        held = []
        for text in texts:
            job = json.loads(text)
            spec = StableTrainingJobSpec.model_validate(job["spec"], context={AS_WRITTEN: True})
            status = StableTrainingJobStatus.model_validate(
                job["status"], context={"job": job["metadata"]["name"]}
            )
            held.append((spec, status))
        share_field_names(held)
    del job
    gc.collect()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    texts = [stored_job(f"job-{n:04d}") for n in range(args.jobs)]
    apart = held_bytes(texts, enabled=False)
    together = held_bytes(texts, enabled=True)
    print(f"{args.jobs} jobs' parsed spec and status, held:")
    print("| policy parts | MiB | KiB a job |")
    print("|---|---|---|")
    for label, size in (("each job its own", apart), ("equal ones shared", together)):
        print(f"| {label} | {size / 2**20:.1f} | {size / args.jobs / 1024:.1f} |")
    print(f"shared / own: {together / apart:.2f}")


if __name__ == "__main__":
    main()
