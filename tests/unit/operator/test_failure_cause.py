"""The failing rank's own words and exit code, read from real torchrun output.

The logs under torchrun_tails/ are what `torchrun --standalone --nnodes 1` wrote (stdout and
stderr together, as a container log holds them) for:

- bad_argument.log: `examples/tiny-gpt/train.py --no-such-flag` (argparse exits 2);
- exception.log: tests/support/workloads/raises_at_start.py (a ValueError at start);
- recorded_two_ranks.log: tests/support/workloads/raises_recorded.py on 2 ranks (an entry
  point under torchrun's `@record`: the box quotes the traceback too);
- import_error.log: tests/support/workloads/broken_import.py (a module the image lacks).

tests/torch/test_torchrun_failure_cause.py runs the same commands again and checks that
today's torch still writes what these files hold. Each case is judged on what a pod's
termination message keeps of the log (the kubelet's FallbackToLogsOnError: the last 2048
bytes, at most 80 lines), as the operator sees it.
"""

from __future__ import annotations

from pathlib import Path

from stabletrain_operator.api.spec import CrashLoopSpec
from stabletrain_operator.observe.culprit import failure_record, failure_suspects
from stabletrain_operator.observe.failure_cause import FailureCause, failure_cause
from stabletrain_operator.observe.pod_facts import MESSAGE_MAX, PodFacts, PodState, failure_evidence
from stabletrain_operator.policy.crashloop import crash_loop

TAILS = Path(__file__).parent / "torchrun_tails"
FALLBACK_BYTES = 2048
FALLBACK_LINES = 80


def termination_message(name: str) -> str:
    """What FallbackToLogsOnError leaves of the log in the pod's status."""
    raw = (TAILS / name).read_bytes()
    return b"\n".join(raw[-FALLBACK_BYTES:].splitlines()[-FALLBACK_LINES:]).decode()


def test_a_bad_argument_names_argparse_s_error_and_the_rank_s_exit_code_2() -> None:
    message = termination_message("bad_argument.log")
    assert "exitcode  : 2" in message
    assert "ChildFailedError" in message
    cause = failure_cause(message)
    assert cause == FailureCause(
        ("train.py: error: unrecognized arguments: --no-such-flag",), exit_code=2, rank=0
    )
    assert cause.describe() == (
        "rank 0 exited with code 2: train.py: error: unrecognized arguments: --no-such-flag"
    )


def test_an_exception_is_quoted_even_when_the_tail_cut_its_traceback_header() -> None:
    message = termination_message("exception.log")
    assert 'Traceback (most recent call last):\n  File "/tmp' not in message  # cut off
    cause = failure_cause(message)
    assert cause.lines == (
        "ValueError: tokenizer file /data/vocab.json has 0 entries; expected a vocabulary",
    )
    assert (cause.exit_code, cause.rank) == (1, 0)


def test_a_tail_that_begins_inside_the_rank_s_last_frame_still_quotes_its_exception() -> None:
    """A longer launcher summary (two ranks, longer paths) leaves less of the rank's output:
    seen on the local node, the tail began at the frame's source line."""
    message = termination_message("exception.log")
    inside = message[message.index("    raise ValueError") :]
    assert 'File "' not in inside.split("ValueError: tokenizer")[0]
    assert failure_cause(inside).lines == (
        "ValueError: tokenizer file /data/vocab.json has 0 entries; expected a vocabulary",
    )


def test_a_tail_cut_in_the_middle_of_a_line_still_quotes_the_exception() -> None:
    """The kubelet keeps the last 2048 bytes: the first line is the end of a cut one. Seen
    on the local node with two pods: the tail began inside the failing import's line."""
    log = (TAILS / "import_error.log").read_text()
    cut = log[log.index("    import stabletrain_missing_helpers") + 20 :]
    assert not cut.startswith(" ")
    cause = failure_cause(cut)
    assert cause.lines == ("ModuleNotFoundError: No module named 'stabletrain_missing_helpers'",)
    assert cause.exit_code == 1
    only_the_line = cut[cut.index("ModuleNotFoundError") :]
    assert failure_cause(only_the_line).lines == cause.lines, "no frame left: the error's name"


def test_the_launcher_s_own_traceback_and_box_are_never_quoted() -> None:
    for name in ("bad_argument.log", "exception.log", "recorded_two_ranks.log", "import_error.log"):
        cause = failure_cause(termination_message(name))
        quoted = " ".join(cause.lines)
        assert cause.lines, name
        assert "ChildFailedError" not in quoted, name
        assert "To enable traceback" not in quoted, name


def test_a_recorded_entry_point_s_traceback_in_the_box_speaks_when_the_tail_lost_the_rest() -> None:
    # Two ranks' tracebacks and torchrun's own are more than 2 KiB: the termination message
    # holds only torchrun's summary, where the traceback @record wrote still names the error.
    message = termination_message("recorded_two_ranks.log")
    assert "\nRuntimeError: CUDA" not in message
    assert "  RuntimeError: CUDA" in message
    expected = ("RuntimeError: CUDA error: out of memory while allocating 2.00 GiB on rank 1",)
    cause = failure_cause(message)
    assert (cause.lines, cause.exit_code, cause.rank) == (expected, 1, 0)
    # The whole log (an in-pod restart's tail may be longer) quotes the rank's own line.
    assert failure_cause((TAILS / "recorded_two_ranks.log").read_text()).lines == expected


def test_the_exit_code_comes_from_torchrun_s_log_line_when_the_box_was_cut() -> None:
    message = termination_message("bad_argument.log")
    before_box = message[: message.index("Traceback (most recent call last):")]
    cause = failure_cause(before_box)
    assert cause.exit_code == 2
    assert cause.lines == ("train.py: error: unrecognized arguments: --no-such-flag",)


def test_a_killed_rank_says_so_and_text_without_an_error_quotes_nothing() -> None:
    killed = (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 0)\n"
        "  exitcode  : -9 (pid: 4242)\n  traceback : Signal 9 (SIGKILL) received by PID 4242\n"
    )
    cause = failure_cause(killed)
    assert (cause.lines, cause.exit_code, cause.rank) == ((), -9, 1)
    assert cause.describe() == "rank 1 was killed by signal 9"
    assert failure_cause("RestoreFailed: step 50 of attempt 2: no copy") == FailureCause()
    assert failure_cause("") == FailureCause()


def test_a_chained_exception_quotes_the_last_one_with_its_message_lines() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/app/train.py", line 9, in load\n'
        "    return json.load(f)\n"
        "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/app/train.py", line 12, in <module>\n'
        "    load()\n"
        "RuntimeError: the dataset index is unreadable\n"
        "rebuild it with make-index\n"
    )
    assert failure_cause(text).lines == (
        "RuntimeError: the dataset index is unreadable",
        "rebuild it with make-index",
    )


def test_the_crash_loop_quotes_the_rank_s_line_and_exit_code_and_keeps_the_tail() -> None:
    message = termination_message("bad_argument.log")
    failed = [
        PodFacts(
            name=f"job-a0-{rank}", attempt=0, rank=rank, state=PodState.FAILED, node=f"n{rank}",
            ip=None, deleting=False, exit_code=1, reason="Error", message=message[-MESSAGE_MAX:],
        )
        for rank in (0, 1)
    ]  # fmt: skip
    record = failure_record(0, failed, failure_suspects(failed), progressed=False)
    assert record.signature == "train.py: error: unrecognized arguments: --no-such-flag"
    assert record.exit_code == 2, "the rank's exit code, not torchrun's 1"
    assert "exitcode  : 2" in record.message, "lastFailure keeps the longer tail"
    loop = crash_loop(CrashLoopSpec(), record, None, every_rank_failed=True)
    assert loop is not None
    assert (
        "failed before its first step: the failing rank exited with code 2: train.py: error: "
        "unrecognized arguments: --no-such-flag; looks like the job's" in loop.message
    )
    assert "Root Cause" not in loop.message
    assert "ChildFailedError" not in loop.message
    assert failure_evidence(failed[0]) == (
        "pod job-a0-0 on node n0 ended Error: rank 0 exited with code 2: train.py: error: "
        "unrecognized arguments: --no-such-flag"
    )
