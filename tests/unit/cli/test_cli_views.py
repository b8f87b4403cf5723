"""The pure parts of the cluster commands: tables, ages, request ids, unreadable status,
and waiting with a clock that is not the wall clock."""

from __future__ import annotations

import io
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import NAME_PATTERN, RecoverySpec
from stabletrain_operator.cli.control import new_request_id, phase_is, wait_for
from stabletrain_operator.cli.errors import CliError
from stabletrain_operator.cli.main import main
from stabletrain_operator.cli.table import age, render_table
from stabletrain_operator.cli.views import job_details, job_status, jobs_table

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def job(name: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "creationTimestamp": (NOW - timedelta(hours=5)).isoformat(),
        },
        "spec": {},
        "status": status or {},
    }


def test_table_columns_align_and_trailing_space_is_dropped() -> None:
    assert render_table(["A", "LONGER"], [["wide cell", "x"], ["b", ""]]).splitlines() == [
        "A          LONGER",
        "wide cell  x",
        "b",
    ]


@pytest.mark.parametrize(
    ("delta", "shown"),
    [
        (timedelta(seconds=5), "5s"),
        (timedelta(minutes=3), "3m"),
        (timedelta(hours=26), "1d"),
        (timedelta(seconds=-4), "0s"),
    ],
)
def test_age_is_kubectl_compact(delta: timedelta, shown: str) -> None:
    assert age(NOW - delta, NOW) == shown
    assert age(None, NOW) == "-"


def test_request_ids_are_dns_labels_and_unique() -> None:
    ids = {new_request_id(NOW) for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(NAME_PATTERN, i) and len(i) <= 63 for i in ids)


def test_jobs_table_with_namespace() -> None:
    table = jobs_table(
        [job("a", {"phase": "Running", "step": 10, "loss": 2.5, "lrScale": 0.25})],
        now=NOW,
        with_namespace=True,
    )
    assert table.splitlines()[1].split() == [
        "ml",
        "a",
        "Running",
        "10",
        "2.5",
        "0.25",
        "0",
        "0",
        "5h",
    ]


def test_a_status_the_cli_cannot_read_names_the_field() -> None:
    with pytest.raises(
        CliError, match=r"job ml/a has a status this CLI cannot read \(status\.phase"
    ):
        job_status(job("a", {"phase": "Exploding"}))


class FakeCluster:
    """Returns the given phases one get() after another."""

    def __init__(self, phases: list[str]) -> None:
        self._phases = phases
        self.gets = 0

    def get(self, name: str) -> dict[str, Any]:
        phase = self._phases[min(self.gets, len(self._phases) - 1)]
        self.gets += 1
        return job(name, {"phase": phase})


def test_wait_prints_each_phase_once_and_returns_when_done() -> None:
    cluster = FakeCluster(["Running", "Stopping", "Stopping", "Suspended"])
    progress = io.StringIO()
    wait_for(
        cluster,
        "a",
        phase_is(Phase.SUSPENDED),
        what="phase Suspended",
        timeout=60,
        progress=progress,
        clock=lambda: 0.0,
        sleep=lambda _: None,
    )
    assert progress.getvalue().split("\n")[:3] == [
        "  a: Running (attempt 0)",
        "  a: Stopping (attempt 0)",
        "  a: Suspended (attempt 0)",
    ]
    assert cluster.gets == 4


def test_wait_stops_at_a_terminal_phase_and_at_the_deadline() -> None:
    with pytest.raises(CliError, match="a is Failed while waiting for phase Running"):
        wait_for(
            FakeCluster(["Stopping", "Failed"]),
            "a",
            phase_is(Phase.RUNNING),
            what="phase Running",
            timeout=60,
            progress=io.StringIO(),
            clock=lambda: 0.0,
            sleep=lambda _: None,
        )
    ticks = iter(range(100))
    with pytest.raises(CliError, match="timed out after 3 s waiting for phase Running"):
        wait_for(
            FakeCluster(["Stopping"]),
            "a",
            phase_is(Phase.RUNNING),
            what="phase Running",
            timeout=3,
            progress=io.StringIO(),
            clock=lambda: float(next(ticks)),
            sleep=lambda _: None,
        )


@pytest.mark.parametrize(
    ("suspend", "phase", "shown"),
    [
        (True, "Running", "Phase:        Running (suspend requested)"),
        (True, "Suspended", "Phase:        Suspended\n"),
        (False, "Suspended", "Phase:        Suspended (resume requested)"),
        (False, "Running", "Phase:        Running\n"),
    ],
)
def test_details_say_when_suspend_is_not_carried_out_yet(
    suspend: bool, phase: str, shown: str
) -> None:
    subject = job("a", {"phase": phase})
    subject["spec"] = {"suspend": suspend}
    assert shown in job_details(subject, now=NOW)


def test_cluster_commands_without_the_kubernetes_client_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "stabletrain_operator.cli.cluster_commands", raising=False)
    monkeypatch.delitem(sys.modules, "stabletrain_operator.cli.cluster", raising=False)
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    assert "status needs the Kubernetes client (kubernetes is not installed)" in err
    assert "pip install 'stabletrain[cli]'" in err


def test_details_show_the_policy_in_force_and_where_each_value_came_from() -> None:
    """`stabletrain status` shows status.policy: budgets in force (inherited from a platform
    policy), the generation the pods run and the sources."""
    recovery = RecoverySpec.model_validate({"budgets": {"maxRollbacks": 2}})
    policy = {
        "specGeneration": 3,
        "directivesGeneration": 5,
        "policies": ["research"],
        "sources": [
            {"source": "Job", "fields": ["detection.lossSpike.ratio"]},
            {
                "source": "StableTrainingPolicy/research",
                "fields": ["recovery.budgets.maxRollbacks"],
            },
        ],
        "detection": {},
        "recovery": recovery.model_dump(mode="json", by_alias=True),
        "checkpoints": {"intervalSteps": 25, "keepLocal": 8, "keepPfs": 8, "spikeMarkers": 2},
    }
    failure = {"attempt": 0, "signature": "train.py: error: unrecognized arguments: --x",
               "exitCode": 2}  # fmt: skip
    shown = job_details(job("a", {"phase": "Running", "policy": policy,
                                  "lastFailure": failure}), now=NOW)  # fmt: skip
    assert "Rollbacks:    0 of 2\n" in shown, "the budget in force, not the built-in 5"
    assert (
        "Policy in force:\n"
        "  spec generation 3, directives generation 5; policies: research\n"
        "  Job: detection.lossSpike.ratio\n"
        "  StableTrainingPolicy/research: recovery.budgets.maxRollbacks\n"
        "  every other field: its built-in default (docs/api.md)\n"
    ) in shown
    assert "Last failure: attempt 0 (exit code 2): train.py: error: unrecognized" in shown
