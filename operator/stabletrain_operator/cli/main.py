"""Entry point: argument parsing, dispatch, and the promise of no tracebacks for known errors.

Command modules are imported when their command runs: the Kubernetes client takes about half
a second to import, which `replay` (often run in loops while tuning a policy) does not need.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from stabletrain_operator.cli.errors import CliError

PROG = "stabletrain"


def build_parser() -> argparse.ArgumentParser:
    cluster = argparse.ArgumentParser(add_help=False)
    options = cluster.add_argument_group("cluster options")
    options.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig's)")
    options.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)"
    )
    options.add_argument("--context", help="kubeconfig context (default: the current one)")
    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument(
        "--wait", action="store_true", help="follow the job until it is done, printing progress"
    )
    waiting.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=600.0,
        help="seconds --wait waits (default 600)",
    )

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect StableTrainingJobs, act on them, replay recovery policies.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = commands.add_parser(
        "status", parents=[cluster], help="a table of jobs, or one job in detail"
    )
    status.add_argument("job", nargs="?", help="job name; omit for a table of all jobs")
    status.add_argument(
        "-A", "--all-namespaces", action="store_true", help="jobs of every namespace"
    )

    history = commands.add_parser(
        "history", parents=[cluster], help="rollbacks and restarts with their evidence"
    )
    history.add_argument("job")

    rollback = commands.add_parser(
        "rollback",
        parents=[cluster, waiting],
        help="ask for a manual rollback (runs once per request id)",
    )
    rollback.add_argument("job")
    rollback.add_argument(
        "--to-step",
        type=_non_negative_int,
        required=True,
        metavar="N",
        help="resume from the newest stable checkpoint at or before step N",
    )
    rollback.add_argument(
        "--lr-factor", type=_lr_factor, metavar="F", help="also multiply the LR scale by F (0<F<1)"
    )
    rollback.add_argument("--reason", default="", help="free text for the history and the Event")
    rollback.add_argument(
        "--request-id", help="use this id (retrying with it never makes a second request)"
    )
    rollback.add_argument(
        "--replace", action="store_true", help="supersede a request that is still pending"
    )

    suspend = commands.add_parser(
        "suspend", parents=[cluster, waiting], help="stop the job's pods, keep the job"
    )
    suspend.add_argument("job")
    resume = commands.add_parser(
        "resume", parents=[cluster, waiting], help="relaunch a suspended job"
    )
    resume.add_argument("job")

    replay = commands.add_parser(
        "replay", help="run a recorded metrics CSV through the detection and the policy"
    )
    replay.add_argument("metrics", metavar="METRICS.csv")
    replay.add_argument(
        "--policy",
        metavar="POLICY.yaml",
        help="detection and recovery parts of a spec (default policy without)",
    )
    replay.add_argument(
        "--json", action="store_true", help="one JSON object per decision per line on stdout"
    )
    replay.add_argument(
        "--plot", metavar="OUT.png", help="write a PNG of loss, baseline and decisions"
    )
    replay.add_argument(
        "--step-seconds",
        type=_positive_seconds,
        default=1.0,
        help="seconds per step, for the policy's cooldowns (default 1)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # urllib3 logs every retry as a warning; the CLI reports the outcome in one sentence.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    try:
        if args.command == "replay":
            from stabletrain_operator.cli.replay_command import run_replay  # noqa: PLC0415

            return run_replay(args, sys.stdout, sys.stderr)
        try:
            from stabletrain_operator.cli.cluster_commands import (  # noqa: PLC0415
                run_cluster_command,
            )
        except ModuleNotFoundError as missing:
            raise CliError(
                f"{args.command} needs the Kubernetes client ({missing.name} is not "
                "installed): pip install 'stabletrain[cli]'"
            ) from None
        return run_cluster_command(args, sys.stdout, sys.stderr)
    except CliError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`| head`); nothing left to tell it.
        sys.stderr.close()
        return 0


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"step {value} is negative")
    return value


def _lr_factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} must lie strictly between 0 and 1")
    return value


if __name__ == "__main__":
    sys.exit(main())
