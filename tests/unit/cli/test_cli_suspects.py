"""`stabletrain status <job>` shows the suspect nodes and the last failure's error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from stabletrain_operator.cli.views import job_details

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def test_status_names_each_suspect_node_with_its_count_and_expiry() -> None:
    job = {
        "metadata": {"name": "gpt", "namespace": "ml"},
        "spec": {},
        "status": {
            "phase": "Running",
            "suspectNodes": [
                {
                    "node": "node-b",
                    "incidents": 2,
                    "lastReason": "pod gpt-a1-1 ended first: killed by signal 9",
                    "lastIncidentAt": (NOW - timedelta(minutes=3)).isoformat(),
                    "expiresAt": (NOW + timedelta(minutes=57)).isoformat(),
                }
            ],
            "lastFailure": {"attempt": 1, "signature": "killed by signal 9"},
        },
    }
    shown = job_details(job, now=NOW)
    lines = shown.splitlines()
    header = lines.index("Suspect nodes:")
    assert lines[header + 1].split() == ["NODE", "INCIDENTS", "LAST", "EXPIRES", "IN", "REASON"]
    assert lines[header + 2].split()[:4] == ["node-b", "2", "3m", "57m"]
    assert "killed by signal 9" in lines[header + 2]
    assert "Last failure: attempt 1: killed by signal 9" in shown
    empty = job_details({**job, "status": {"phase": "Running"}}, now=NOW)
    assert "Suspect nodes:\n  (none)" in empty
