"""Pods that fail at import end the job at once, with the error's own words in status and in
the Event, instead of being relaunched again and again with a growing backoff."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.localnode import LocalCluster
from support.operator import Jobs, job_manifest

BROKEN = Path(__file__).resolve().parents[1] / "support" / "workloads" / "broken_import.py"
ERROR = "ModuleNotFoundError: No module named 'stabletrain_missing_helpers'"


@pytest.mark.usefixtures("operator")
def test_pods_failing_at_import_end_the_job_with_the_error_named(
    jobs: Jobs, local_cluster: LocalCluster
) -> None:
    manifest = job_manifest("broken", {})
    manifest["spec"]["workers"]["template"]["spec"]["containers"][0]["command"] = [
        "torchrun", str(BROKEN),
    ]  # fmt: skip
    jobs.create(manifest)
    done = jobs.wait("broken", lambda s: s.get("phase") in ("Failed", "Succeeded"), 180,
                     "the crash loop to end the job")  # fmt: skip
    assert done["phase"] == "Failed", done.get("conditions")
    failed = {c["type"]: c for c in done["conditions"]}["Failed"]
    assert failed["reason"] == "CrashLoop", failed
    assert ERROR in failed["message"], failed["message"]
    assert "the job's" in failed["message"]
    assert done["lastFailure"]["signature"] == ERROR
    assert done["lastFailure"]["beforeFirstStep"]
    assert done["counters"]["restarts"] <= 1, "at most one relaunch before the loop is named"
    events = [e["message"] for e in jobs.events("broken") if e["reason"] == "CrashLoop"]
    assert len(events) == 2, events  # the decision, then the job failing
    assert all(ERROR in message for message in events), events
    assert jobs.pods("broken") == [], "a failed job keeps no pods"
    print(f"\ncrash loop after {done['counters']['restarts']} restart(s): {failed['message']}")


TINY_GPT = Path(__file__).resolve().parents[2] / "examples" / "tiny-gpt" / "train.py"
BAD_ARGUMENT = "train.py: error: unrecognized arguments: --no-such-flag"


@pytest.mark.usefixtures("operator")
def test_a_rejected_argument_fails_the_job_quoting_the_script_s_error_and_exit_code(
    jobs: Jobs, local_cluster: LocalCluster
) -> None:
    """The tiny GPT's own argparse refuses a flag: the Failed condition and its Event quote
    the script's `error:` line and the rank's exit code 2, not torchrun's summary (whose
    own exit code is 1); lastFailure keeps the longer tail with that summary."""
    manifest = job_manifest("bad-flag", {})
    container = manifest["spec"]["workers"]["template"]["spec"]["containers"][0]
    container["command"] = ["torchrun", str(TINY_GPT), "--no-such-flag"]
    jobs.create(manifest)
    done = jobs.wait("bad-flag", lambda s: s.get("phase") in ("Failed", "Succeeded"), 180,
                     "the crash loop to end the job")  # fmt: skip
    assert done["phase"] == "Failed", done.get("conditions")
    failed = {c["type"]: c for c in done["conditions"]}["Failed"]
    assert failed["reason"] == "CrashLoop", failed
    assert f"the failing rank exited with code 2: {BAD_ARGUMENT}" in failed["message"], failed
    assert "Root Cause" not in failed["message"]
    assert "ChildFailedError" not in failed["message"]
    assert done["lastFailure"]["signature"] == BAD_ARGUMENT
    assert done["lastFailure"]["exitCode"] == 2
    assert "exitcode  : 2" in done["lastFailure"]["message"], "the longer tail is kept"
    events = [e["message"] for e in jobs.events("bad-flag") if e["reason"] == "CrashLoop"]
    assert events, "a CrashLoop Event"
    assert all(BAD_ARGUMENT in m and "code 2" in m for m in events), events
    print(f"\nFailed: {failed['message']}")
