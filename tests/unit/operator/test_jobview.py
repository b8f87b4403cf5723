"""Which version of a job a tick acts on, and which status changes are written at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import StableTrainingJobSpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.jobview import (
    WATCH_LAG_SECONDS,
    JobView,
    Source,
    StatusWrite,
    identity,
    look_again_by,
    parse,
    source,
    write_needed,
)

MINIMAL = Path(__file__).resolve().parents[3] / "examples" / "manifests" / "minimal.yaml"
SPEC: dict[str, Any] = yaml.safe_load(MINIMAL.read_text())["spec"]


def _view(version: str, obtained_at: float) -> JobView:
    spec = StableTrainingJobSpec.model_validate(SPEC)
    job = {"metadata": {"name": "j", "resourceVersion": version}, "spec": SPEC}
    return JobView(version, job, spec, StableTrainingJobStatus(), obtained_at)


def test_a_daemon_that_holds_nothing_reads_the_job() -> None:
    assert source(None, "7", now=100.0) is Source.READ


def test_the_live_body_at_the_held_version_costs_no_read_however_old() -> None:
    assert source(_view("7", obtained_at=0.0), "7", now=10_000.0) is Source.HELD


def test_a_live_body_behind_the_daemons_own_write_is_a_watch_catching_up() -> None:
    held = _view("8", obtained_at=100.0)
    assert source(held, "7", now=100.0 + WATCH_LAG_SECONDS / 2) is Source.HELD


def test_a_different_version_that_lasts_is_read_from_the_api_server() -> None:
    """Somebody else changed the job, or the watch is that late: the tick must not act on
    either the held version or a live body that may be older than it."""
    held = _view("8", obtained_at=100.0)
    assert source(held, "9", now=100.0 + WATCH_LAG_SECONDS) is Source.READ
    assert source(held, "7", now=100.0 + WATCH_LAG_SECONDS + 5) is Source.READ


def test_the_held_view_keeps_the_objects_identity_not_its_fields_or_status() -> None:
    written = {
        "apiVersion": "stabletrain.dev/v1alpha1",
        "kind": "StableTrainingJob",
        "metadata": {
            "name": "j", "namespace": "ns", "uid": "u-1", "resourceVersion": "8",
            "generation": 3, "managedFields": [{"manager": "kopf"}] * 20,
            "annotations": {"stabletrain.dev/last-handled-configuration": "x" * 5000},
        },
        "spec": SPEC,
        "status": {"phase": "Running", "conditions": [{"type": "Healthy"}] * 5},
    }  # fmt: skip
    assert identity(written) == {
        "apiVersion": "stabletrain.dev/v1alpha1",
        "kind": "StableTrainingJob",
        "metadata": {
            "name": "j", "namespace": "ns", "uid": "u-1", "resourceVersion": "8", "generation": 3,
        },
    }  # fmt: skip


def _due(
    before: StableTrainingJobStatus, after: StableTrainingJobStatus, since: float
) -> StatusWrite | None:
    return write_needed(before, after, progress_written_at=0.0, now=since, progress_seconds=30)


def test_progress_alone_waits_for_its_interval_and_is_written_after_it() -> None:
    before = StableTrainingJobStatus(phase=Phase.RUNNING, step=10, loss=2.5)
    after = before.model_copy(update={"step": 11, "loss": 2.4, "grad_norm": 0.9})
    assert _due(before, after, since=29.9) is None
    assert _due(before, after, since=30.0) is StatusWrite.PROGRESS


def test_anything_but_progress_is_written_at_once_with_the_progress() -> None:
    before = StableTrainingJobStatus(phase=Phase.RUNNING, step=10, loss=2.5)
    stopping = before.model_copy(update={"phase": Phase.STOPPING, "step": 12})
    assert _due(before, stopping, since=0.1) is StatusWrite.DECISION
    trips = before.model_copy(update={"counters": before.counters.model_copy(update={"trips": 1})})
    assert _due(before, trips, since=0.1) is StatusWrite.DECISION
    progressed = before.model_copy(update={"attempt_progressed": True})
    assert _due(before, progressed, since=0.1) is StatusWrite.DECISION


def test_an_unchanged_status_is_never_written() -> None:
    status = StableTrainingJobStatus(phase=Phase.RUNNING, step=10)
    assert _due(status, status.model_copy(), since=1_000.0) is None


def test_a_spec_that_does_not_validate_is_refused_with_the_field_named(caplog: Any) -> None:
    job = {"metadata": {"name": "bad"}, "spec": {**SPEC, "workers": {"nodes": -1}}}
    assert parse(job) is None
    assert "job bad: spec does not match" in caplog.text
    assert "workers.nodes" in caplog.text
    assert parse({"metadata": {"name": "ok"}, "spec": SPEC}) is not None


def test_a_tick_that_acted_on_a_held_version_looks_again_once_the_watch_had_its_time() -> None:
    """A finished or suspended job waits a minute for its next tick. When the tick that
    suspended it acted on its own held write while the live body already showed another
    version (spec.suspend cleared at once), it looks again when the watch lag is over."""
    acted_on = _view("8", obtained_at=100.0)
    a_minute = 100.5 + 60.0
    assert look_again_by(acted_on, "9", a_minute) == 100.0 + WATCH_LAG_SECONDS
    assert look_again_by(acted_on, "8", a_minute) == a_minute
    assert look_again_by(acted_on, "9", 100.5) == 100.5
