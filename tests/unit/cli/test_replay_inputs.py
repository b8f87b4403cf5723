"""Bad input to replay: a clear message naming file, line and column (or field), exit 2,
never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from stabletrain_operator.cli.main import main

GOOD_ROWS = "".join(f"{step},{2.0 + 1.0 / (step + 1):.4f}\n" for step in range(30))

BAD_CSV = [
    ("empty file", "", "m.csv:1: empty file"),
    ("no loss column", "step,grad_norm\n1,2\n", "m.csv:1: header has no 'loss' column"),
    ("no step column", "loss\n1.0\n", "m.csv:1: header has no 'step' column"),
    ("header only", "step,loss\n", "m.csv:2: no data rows after the header"),
    ("duplicate column", "step,loss,loss\n1,2,3\n", "m.csv:1: column loss: column appears twice"),
    ("bad column name", "step,loss,Val Loss\n1,2,3\n", "m.csv:1: column val loss: not a built-in"),
    (
        "step not integer",
        "step,loss\n1,2.0\n2.5,2.0\n",
        "m.csv:3: column step: '2.5' is not an integer",
    ),
    ("negative step", "step,loss\n-1,2.0\n", "m.csv:2: column step: step -1 is negative"),
    (
        "attempt goes back",
        "step,loss,attempt\n5,2.0,1\n6,2.0,0\n",
        "m.csv:3: column attempt: attempt 0 follows attempt 1",
    ),
    (
        "step repeats within an attempt",
        "step,loss,attempt\n5,2.0,0\n5,2.0,0\n",
        "m.csv:3: column step: step 5 does not follow step 5 within attempt 0",
    ),
    (
        "empty attempt",
        "step,loss,attempt\n5,2.0,\n",
        "m.csv:2: column attempt: '' is not an integer",
    ),
    (
        "time goes back",
        "step,loss,time\n1,2.0,100\n2,2.0,99.5\n",
        "m.csv:3: column time: time 99.5 is before",
    ),
    (
        "time not finite",
        "step,loss,time\n1,2.0,nan\n",
        "m.csv:2: column time: time nan is not a finite",
    ),
    ("garbage loss", "step,loss\n1,2.0\n2,abc\n", "m.csv:3: column loss: 'abc' is not a number"),
    ("garbage grad norm", "step,loss,grad_norm\n1,2.0,1..0\n", "m.csv:2: column grad_norm: '1..0'"),
    (
        "garbage custom",
        "step,loss,val_loss\n1,2.0,x\n",
        "m.csv:2: column val_loss: 'x' is not a number",
    ),
    ("short row", "step,loss,lr\n1,2.0\n", "m.csv:2: 2 fields, but the header has 3"),
    ("long row", "step,loss\n1,2.0,3\n", "m.csv:2: 3 fields, but the header has 2"),
    ("nameless column", "step,loss,\n1,2.0,\n", "m.csv:1: a column has no name"),
    ("NUL byte", "step,loss\n1,2.0\n2,\x003\n", "m.csv:3: column loss: '\\x003' is not a number"),
    (
        "huge field",
        "step,loss\n1,2.0\n2," + "9" * 200_000 + "\n",
        "m.csv:3: malformed CSV: field larger",
    ),
    (
        "fractional float step",
        "step,loss\n1.5,2.0\n",
        "m.csv:2: column step: '1.5' is not an integer",
    ),
]


@pytest.mark.parametrize(("case", "content", "expected"), BAD_CSV, ids=[c[0] for c in BAD_CSV])
def test_malformed_csv_is_refused_with_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, content: str, expected: str
) -> None:
    metrics = tmp_path / "m.csv"
    metrics.write_text(content)
    assert main(["replay", str(metrics), "--json"]) == 2, case
    captured = capsys.readouterr()
    assert captured.out == ""
    assert expected in captured.err
    assert captured.err.startswith("stabletrain: error: ")
    assert "Traceback" not in captured.err


def test_binary_and_missing_files_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "m.csv"
    binary.write_bytes(b"step,loss\n\xff\xfe\x00garbage\n")
    assert main(["replay", str(binary)]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err
    assert main(["replay", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_integral_float_steps_are_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "m.csv"
    metrics.write_text("step,loss\n" + GOOD_ROWS.replace(",", ".0,"))
    assert main(["replay", str(metrics)]) == 0
    assert "(steps 0-29)" in capsys.readouterr().err


def test_blank_lines_and_a_byte_order_mark_are_tolerated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "m.csv"
    metrics.write_text("\ufeffStep,Loss\n" + GOOD_ROWS.replace("\n", "\n\n", 3))
    assert main(["replay", str(metrics)]) == 0
    assert "replaying 30 rows" in capsys.readouterr().err


BAD_POLICY = [
    ("not yaml", "recovery: [\n", "p.yaml:2:1: not valid YAML"),
    ("not a mapping", "- 1\n- 2\n", "p.yaml: expected a mapping with detection and/or recovery"),
    ("unknown top-level", "workers: {}\n", "unknown top-level key(s) workers"),
    (
        "unknown field",
        "detection:\n  lossSpike:\n    ratioo: 2\n",
        "detection.lossSpike.ratioo: Extra inputs",
    ),
    (
        "wrong type",
        "recovery:\n  budgets:\n    maxRollbacks: lots\n",
        "recovery.budgets.maxRollbacks: Input should be a valid integer",
    ),
    (
        "negative count",
        "recovery:\n  budgets:\n    maxRestarts: -1\n",
        "recovery.budgets.maxRestarts: Input should be greater than or equal to 0",
    ),
    (
        "unknown action",
        "recovery:\n  rules:\n    - {name: a, onSignals: [LossSpike], action: Explode}\n",
        "recovery.rules.0.action: Input should be",
    ),
    (
        "lr factor not below 1",
        "recovery:\n  rules:\n    - name: a\n      onSignals: [LossSpike]\n      action: Rollback\n"
        "      rollback: {lrFactor: 1.5}\n",
        "recovery.rules.0.rollback.lrFactor: Input should be less than 1",
    ),
    (
        "bad signal name",
        "recovery:\n  rules:\n    - {name: a, onSignals: [Lossspike], action: Alert}\n",
        "recovery.rules.0.onSignals.0: String should match pattern",
    ),
    (
        "undefined custom signal",
        "recovery:\n  rules:\n    - {name: a, onSignals: ['custom:val_loss'], action: Alert}\n",
        "recovery.rules.0.onSignals: custom:val_loss is not defined in detection.custom",
    ),
    (
        "duplicate rule names",
        "recovery:\n  rules:\n    - {name: a, onSignals: [LossSpike], action: Alert}\n"
        "    - {name: a, onSignals: [NonFinite], action: Alert}\n",
        "rule names must be unique, repeated: a",
    ),
]


@pytest.mark.parametrize(
    ("case", "content", "expected"), BAD_POLICY, ids=[c[0] for c in BAD_POLICY]
)
def test_malformed_policy_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, content: str, expected: str
) -> None:
    metrics = tmp_path / "m.csv"
    metrics.write_text("step,loss\n" + GOOD_ROWS)
    policy = tmp_path / "p.yaml"
    policy.write_text(content)
    assert main(["replay", "--policy", str(policy), str(metrics)]) == 2, case
    captured = capsys.readouterr()
    assert expected in captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""


def test_empty_policy_file_means_the_default_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "m.csv"
    metrics.write_text("step,loss\n" + GOOD_ROWS)
    policy = tmp_path / "p.yaml"
    policy.write_text("")
    assert main(["replay", "--policy", str(policy), str(metrics)]) == 0
    assert "p.yaml" in capsys.readouterr().err


def test_bad_arguments_exit_2_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["replay", "m.csv", "--step-seconds", "-1"])
    assert exited.value.code == 2
    assert "must be a positive number of seconds" in capsys.readouterr().err


def test_unwritable_plot_path_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "m.csv"
    metrics.write_text("step,loss\n" + GOOD_ROWS)
    assert main(["replay", str(metrics), "--plot", str(tmp_path / "no" / "dir" / "x.png")]) == 1
    err = capsys.readouterr().err
    assert "cannot write the plot to" in err
    assert "Traceback" not in err
