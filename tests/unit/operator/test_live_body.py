"""kopf keeps of each job only the metadata its daemon reads: the spec, the status and the
managedFields of every watched version are dropped before kopf holds it as the daemon's body.

The second test runs kopf's own event processing, so it fails if kopf ever stops handing event
handlers the object its daemons view."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from typing import Any

import kopf
from kopf._cogs.structs import references
from kopf._core.actions import lifecycles
from kopf._core.engines import indexing
from kopf._core.reactor import inventory, processing

from stabletrain_operator.api.constants import GROUP, PLURAL, VERSION
from stabletrain_operator.handlers.live_body import hold_metadata_only, keep_metadata_only

FINALIZER = "stabletrain.dev/operator"


def watched_job(version: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StableTrainingJob",
        "metadata": {
            "name": "job",
            "namespace": "ns",
            "uid": "uid-1",
            "resourceVersion": version,
            "labels": {"kueue.x-k8s.io/queue-name": "team-a"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": '{"spec": {}}',
                f"{GROUP}/last-handled-configuration": "{}",
            },
            "finalizers": [FINALIZER],
            "managedFields": [{"manager": "stabletrain", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"replicas": 2, "template": {"spec": {"containers": []}}},
        "status": {"phase": "Running", "step": 100},
    }


def test_the_kept_job_is_its_metadata_without_managed_fields_or_kubectl_s_copy() -> None:
    job = watched_job("7")
    keep_metadata_only(job)
    assert set(job) == {"apiVersion", "kind", "metadata"}
    metadata = job["metadata"]
    assert "managedFields" not in metadata
    assert metadata["annotations"] == {f"{GROUP}/last-handled-configuration": "{}"}
    assert metadata["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    assert (metadata["resourceVersion"], metadata["uid"], metadata["finalizers"]) == (
        "7", "uid-1", [FINALIZER],
    )  # fmt: skip


def test_a_job_without_metadata_or_annotations_is_left_as_it_is() -> None:
    bare: dict[str, Any] = {"kind": "StableTrainingJob", "spec": {}}
    keep_metadata_only(bare)
    assert bare == {"kind": "StableTrainingJob"}
    unannotated = watched_job("1")
    del unannotated["metadata"]["annotations"]
    keep_metadata_only(unannotated)
    assert "annotations" not in unannotated["metadata"]


def test_kopf_s_daemon_body_holds_the_emptied_object_of_every_event() -> None:
    seen: list[dict[str, Any]] = []

    async def daemon(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        seen.append(copy.deepcopy(dict(body)))
        await stopped.wait()

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        registry = kopf.OperatorRegistry()
        kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)(hold_metadata_only)
        kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, initial_delay=0)(daemon)
        settings = kopf.OperatorSettings()
        settings.persistence.finalizer = FINALIZER  # already on the job: kopf patches nothing
        memories = inventory.ResourceMemories()
        resource = references.Resource(
            GROUP, VERSION, PLURAL, kind="StableTrainingJob", namespaced=True,
            verbs=["list", "watch", "patch"],
        )  # fmt: skip
        for version, kind in (("1", None), ("2", "MODIFIED")):
            await processing.process_resource_event(
                lifecycle=lifecycles.all_at_once, indexers=indexing.OperatorIndexers(),
                registry=registry, settings=settings, memories=memories,
                memobase=kopf.Memo(), resource=resource,
                raw_event={"type": kind, "object": watched_job(version)},  # type: ignore[typeddict-item]
                event_queue=asyncio.Queue(), no_throttling=True,
            )  # fmt: skip
            await asyncio.sleep(0.05)
        memory = await memories.recall(watched_job("2"))  # type: ignore[arg-type]
        held = memory.daemons_memory.live_fresh_body
        assert held is not None
        kept = copy.deepcopy(dict(held))
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        return kept, list(seen)

    kept, daemon_saw = asyncio.run(scenario())
    assert kept["metadata"]["resourceVersion"] == "2"
    assert "spec" not in kept
    assert "status" not in kept
    assert "managedFields" not in kept["metadata"]
    assert kept["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    assert daemon_saw
    assert "spec" not in daemon_saw[0]
