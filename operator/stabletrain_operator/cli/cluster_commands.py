"""status, history, rollback, suspend, resume: the commands that talk to the cluster."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TextIO

from stabletrain_operator.api.constants import Phase
from stabletrain_operator.cli.cluster import Cluster
from stabletrain_operator.cli.control import (
    phase_is,
    request_rollback,
    rollback_done,
    set_suspend,
    wait_for,
)
from stabletrain_operator.cli.errors import CliError
from stabletrain_operator.cli.views import history_view, job_details, jobs_table


def run_cluster_command(args: argparse.Namespace, out: TextIO, notes: TextIO) -> int:
    cluster = Cluster.connect(
        kubeconfig=args.kubeconfig, namespace=args.namespace, context=args.context
    )
    try:
        return _COMMANDS[args.command](cluster, args, out, notes)
    finally:
        cluster.close()


def _status(cluster: Cluster, args: argparse.Namespace, out: TextIO, notes: TextIO) -> int:
    now = datetime.now(UTC)
    if args.job:
        print(job_details(cluster.get(args.job), now=now), file=out)
        return 0
    jobs = cluster.list_jobs(all_namespaces=args.all_namespaces)
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"namespace {cluster.namespace}"
        print(f"no StableTrainingJobs in {where}", file=notes)
        return 0
    print(jobs_table(jobs, now=now, with_namespace=args.all_namespaces), file=out)
    return 0


def _history(cluster: Cluster, args: argparse.Namespace, out: TextIO, notes: TextIO) -> int:
    job = cluster.get(args.job)
    try:
        events = cluster.events(args.job)
    except CliError as error:
        print(f"note: Events not shown: {error}", file=notes)
        events = []
    print(history_view(job, events, now=datetime.now(UTC)), file=out)
    return 0


def _rollback(cluster: Cluster, args: argparse.Namespace, out: TextIO, notes: TextIO) -> int:
    request_id, written = request_rollback(
        cluster,
        args.job,
        to_step=args.to_step,
        lr_factor=args.lr_factor,
        reason=args.reason,
        request_id=args.request_id,
        replace=args.replace,
    )
    if written:
        print(
            f"manual rollback {request_id} of {args.job} requested (to step <= {args.to_step})",
            file=out,
        )
    else:
        print(
            f"manual rollback {request_id} of {args.job} was already requested; nothing written",
            file=out,
        )
    if args.wait:
        print(f"waiting for the operator to carry out {request_id} ...", file=notes)
        job = wait_for(
            cluster,
            args.job,
            rollback_done(request_id),
            what=f"rollback {request_id}",
            timeout=args.timeout,
            progress=notes,
        )
        status = job["status"]
        print(f"{args.job} runs again from attempt {status.get('attempt')}", file=notes)
    return 0


def _suspend_or_resume(
    cluster: Cluster, args: argparse.Namespace, out: TextIO, notes: TextIO
) -> int:
    suspend = args.command == "suspend"
    changed = set_suspend(cluster, args.job, suspend=suspend)
    verb = "suspend" if suspend else "resume"
    if changed:
        print(f"{args.job}: {verb} requested", file=out)
    else:
        already = "suspended" if suspend else "not suspended"
        print(f"{args.job} is already {already}; nothing written", file=out)
    if args.wait:
        target = Phase.SUSPENDED if suspend else Phase.RUNNING
        print(f"waiting for {args.job} to be {target.value} ...", file=notes)
        wait_for(
            cluster,
            args.job,
            phase_is(target),
            what=f"phase {target.value}",
            timeout=args.timeout,
            progress=notes,
        )
    return 0


_COMMANDS = {
    "status": _status,
    "history": _history,
    "rollback": _rollback,
    "suspend": _suspend_or_resume,
    "resume": _suspend_or_resume,
}
