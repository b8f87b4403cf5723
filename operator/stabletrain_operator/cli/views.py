"""What `status` and `history` print, as pure functions of the objects the API returned.

The job's status is read through the same pydantic models the operator writes it with, so
the CLI shows exactly the fields that exist; a status it cannot read is reported with the
field named instead of a half-drawn table.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from stabletrain_contract.base import error_lines
from stabletrain_contract.checkpoint.inventory import CheckpointRecord, TierCopy
from stabletrain_contract.directives import SkipRange
from stabletrain_operator.api.constants import Phase
from stabletrain_operator.api.spec import RecoverySpec
from stabletrain_operator.api.status import StableTrainingJobStatus
from stabletrain_operator.cli.errors import CliError
from stabletrain_operator.cli.table import age, integer, number, render_table


def job_status(job: dict[str, Any]) -> StableTrainingJobStatus:
    try:
        return StableTrainingJobStatus.model_validate(job.get("status") or {})
    except ValidationError as error:
        first = error_lines(error, under="status")[0]
        raise CliError(
            f"job {_name(job)} has a status this CLI cannot read ({first}); "
            "is the operator newer than this CLI?"
        ) from None


def jobs_table(jobs: list[dict[str, Any]], *, now: datetime, with_namespace: bool) -> str:
    header = ["NAME", "PHASE", "STEP", "LOSS", "LR SCALE", "ROLLBACKS", "RESTARTS", "AGE"]
    if with_namespace:
        header.insert(0, "NAMESPACE")
    rows = []
    for job in jobs:
        status = job_status(job)
        row = [
            job["metadata"]["name"],
            status.phase.value,
            integer(status.step),
            number(status.loss),
            number(status.lr_scale),
            str(status.counters.rollbacks),
            str(status.counters.restarts),
            age(_created(job), now),
        ]
        if with_namespace:
            row.insert(0, job["metadata"]["namespace"])
        rows.append(row)
    return render_table(header, rows)


def job_details(job: dict[str, Any], *, now: datetime) -> str:
    status = job_status(job)
    budgets = (status.policy.recovery if status.policy is not None else _recovery(job)).budgets
    spec = job.get("spec") or {}
    phase = status.phase.value + _suspend_note(bool(spec.get("suspend")), status.phase)
    lines = [
        f"Name:         {job['metadata']['name']}",
        f"Namespace:    {job['metadata']['namespace']}",
        f"Phase:        {phase}",
        f"Attempt:      {status.attempt}",
        f"Step:         {integer(status.step)}",
        f"Loss:         {number(status.loss)} (healthy baseline {number(status.loss_baseline)})",
        f"Grad norm:    {number(status.grad_norm)}",
        f"Tokens/s:     {number(status.tokens_per_second, 6)}",
        f"LR scale:     {number(status.lr_scale)}",
        f"Skip ranges:  {_skips(status)}",
        f"Rollbacks:    {status.counters.rollbacks} of {budgets.max_rollbacks}",
        f"Restarts:     {status.counters.restarts} of {budgets.max_restarts}",
    ]
    if status.plan is not None:
        plan = status.plan
        lines.append(
            f"In flight:    {plan.action.value} on {plan.signal} from step {plan.from_step}, "
            f"attempt {plan.from_attempt} -> {plan.next_attempt}"
        )
    manual = spec.get("manualRollback") or {}
    if manual.get("requestId") and manual.get("requestId") != status.last_manual_request_id:
        lines.append(f"Pending:      manual rollback {manual['requestId']}")
    if status.last_failure is not None:
        failure = status.last_failure
        code = f" (exit code {failure.exit_code})" if failure.exit_code is not None else ""
        lines.append(f"Last failure: attempt {failure.attempt}{code}: {failure.signature}")
    lines += ["", "Policy in force:", _indent(policy_sources(status))]
    lines += ["", "Checkpoints:", _indent(checkpoints_table(status.checkpoints))]
    lines += ["", "Suspect nodes:", _indent(suspects_table(status, now=now))]
    lines += ["", "Conditions:", _indent(conditions_table(status, now=now))]
    return "\n".join(lines)


def policy_sources(status: StableTrainingJobStatus) -> str:
    """Which spec generation's policy the pods run, and where each value came from."""
    policy = status.policy
    if policy is None:
        return "(none yet)"
    lines = [
        f"spec generation {policy.spec_generation}, directives generation "
        f"{policy.directives_generation}; policies: {', '.join(policy.policies) or 'none'}"
    ]
    lines += [f"{source.source}: {', '.join(source.fields)}" for source in policy.sources]
    lines.append("every other field: its built-in default (docs/api.md)")
    return "\n".join(lines)


def suspects_table(status: StableTrainingJobStatus, *, now: datetime) -> str:
    """The nodes relaunches keep away from: how often each was the culprit, and why."""
    if not status.suspect_nodes:
        return "(none)"
    rows = [
        [n.node, str(n.incidents), age(n.last_incident_at, now), age(now, n.expires_at),
         n.last_reason]
        for n in status.suspect_nodes
    ]  # fmt: skip
    return render_table(["NODE", "INCIDENTS", "LAST", "EXPIRES IN", "REASON"], rows)


def checkpoints_table(records: tuple[CheckpointRecord, ...]) -> str:
    """One row per step, one column per tier: PFS, then every node's local tier."""
    if not records:
        return "(none reported yet)"
    nodes = sorted({copy.node for record in records for copy in record.local})
    header = ["STEP", "ATTEMPT", "STABLE", "PFS", *(f"LOCAL {node}" for node in nodes)]
    rows = []
    for record in sorted(records, key=lambda r: r.step):
        stable = "spike-marker" if record.spike_marker else ("yes" if record.stable else "no")
        row = [str(record.step), str(record.attempt), stable, _copy(record.pfs)]
        row += [_copy(record.local_copy(node)) for node in nodes]
        rows.append(row)
    return render_table(header, rows)


def conditions_table(status: StableTrainingJobStatus, *, now: datetime) -> str:
    if not status.conditions:
        return "(none yet)"
    rows = [
        [c.type, c.status, c.reason, age(c.last_transition_time, now), c.message]
        for c in status.conditions
    ]
    return render_table(["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"], rows)


def history_view(job: dict[str, Any], events: list[dict[str, Any]], *, now: datetime) -> str:
    """Every decision from status (rollbacks, restarts, ReduceLR, Alert, Fail), then the
    job's Events, which carry the evidence."""
    status = job_status(job)
    lines = [f"History of {job['metadata']['namespace']}/{job['metadata']['name']}:"]
    if status.rollback_history:
        rows = []
        for entry in status.rollback_history:
            who = entry.rule or (f"manual {entry.request_id}" if entry.request_id else "-")
            rows.append(
                [
                    age(entry.time, now),
                    entry.action.value,
                    who,
                    entry.signal,
                    "-" if entry.anomaly_class is None else entry.anomaly_class.value,
                    integer(entry.onset_step),
                    str(entry.from_step),
                    integer(entry.to_step),
                    number(entry.lr_scale),
                    ", ".join(_range(r) for r in entry.skipped) or "-",
                    str(entry.attempt),
                ]
            )
        header = ["AGO", "ACTION", "RULE", "SIGNAL", "CLASS", "ONSET", "FROM", "TO"]
        header += ["LR SCALE", "SKIPPED", "ATTEMPT"]
        lines.append(_indent(render_table(header, rows)))
    else:
        lines.append("  no rollbacks or restarts")
    if status.last_trip is not None:
        trip = status.last_trip
        lines += [
            "",
            f"Last trip: {trip.signal} ({trip.anomaly_class.value}) at step {trip.step} on "
            f"node {trip.node}, onset {trip.onset_step}, attempt {trip.attempt}",
            f"  evidence: {trip.evidence or '-'}",
        ]
    lines += ["", "Events (evidence of each decision):"]
    if events:
        rows = [
            [
                age(_event_time(event), now),
                event.get("type") or "-",
                event.get("reason") or "-",
                (event.get("message") or "").replace("\n", " "),
            ]
            for event in sorted(events, key=lambda e: _event_time(e) or now)
        ]
        lines.append(_indent(render_table(["AGO", "TYPE", "REASON", "MESSAGE"], rows)))
    else:
        lines.append("  none (Events expire after an hour by default)")
    return "\n".join(lines)


def _suspend_note(suspend: bool, phase: Phase) -> str:
    """Say so when spec.suspend asks for something the operator has not done yet."""
    if suspend and phase is not Phase.SUSPENDED:
        return " (suspend requested)"
    if not suspend and phase is Phase.SUSPENDED:
        return " (resume requested)"
    return ""


def _recovery(job: dict[str, Any]) -> RecoverySpec:
    recovery = (job.get("spec") or {}).get("recovery") or {}
    try:
        return RecoverySpec.model_validate(recovery)
    except ValidationError:
        return RecoverySpec()


def _copy(copy: TierCopy | None) -> str:
    if copy is None:
        return "-"
    if copy.verified:
        return "verified"
    return "complete" if copy.complete else "partial"


def _skips(status: StableTrainingJobStatus) -> str:
    if not status.active_skip_ranges:
        return "none"
    shown = ", ".join(_range(r) for r in status.active_skip_ranges[:4])
    total = max(status.skip_ranges_total, len(status.active_skip_ranges))
    more = f" ... ({total} in total)" if total > 4 else ""
    spilled = (
        f"; full list in ConfigMap {status.skip_ranges_config_map}"
        if status.skip_ranges_config_map
        else ""
    )
    return shown + more + spilled


def _range(skip: SkipRange) -> str:
    if skip.to_run_end:
        return f"shards {','.join(skip.shard_ids)} to the end"
    return f"{skip.unit.value.lower()}s {skip.first}-{skip.last}"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _name(job: dict[str, Any]) -> str:
    metadata = job.get("metadata") or {}
    return f"{metadata.get('namespace', '?')}/{metadata.get('name', '?')}"


def _created(job: dict[str, Any]) -> datetime | None:
    return _timestamp(job["metadata"].get("creationTimestamp"))


def _event_time(event: dict[str, Any]) -> datetime | None:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        found = _timestamp(event.get(key))
        if found is not None:
            return found
    metadata = event.get("metadata") or {}
    return _timestamp(metadata.get("creationTimestamp"))


def _timestamp(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return None
