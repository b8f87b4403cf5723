"""A supervised pod's attempt, read from its supervisor's report instead of its container.

Under the supervisor (recovery.restart InPlace) a trip, a crash or a killed rank ends the
training processes but not the container: the pod stays Running. The supervisor's report
says how the attempt ended, with the same termination message a container would have left,
so the pod is presented to the policy exactly as a pod whose container ended that way:
the culprit rules, the trip reports and the crash loop read it unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from stabletrain_contract.supervisor import ProcessState, SupervisorReport
from stabletrain_operator.observe.pod_facts import PodFacts, PodState, termination_facts

REASONS = {
    ProcessState.EXITED: "Error",
    ProcessState.STOPPED: "Stopped",
    ProcessState.UNKILLABLE: "Unkillable",
}
"""The container-status reason a supervised attempt's end stands for (exit code 0 reads
Completed, as a container's would)."""


def attempt_ended(report: SupervisorReport | None, attempt: int) -> bool:
    """The report says the processes of `attempt` ended (or will not end)."""
    return (
        report is not None
        and report.attempt == attempt
        and report.state not in (ProcessState.RUNNING, ProcessState.STOPPING)
    )


def with_reports(
    pods: Sequence[PodFacts], reports: Mapping[str, SupervisorReport]
) -> list[PodFacts]:
    """`pods`, each running supervised pod whose attempt ended shown as the container that
    ended the same way: Succeeded for exit code 0, else Failed with the supervisor's exit
    code, message and end time."""
    return [_as_reported(pod, reports.get(pod.name)) for pod in pods]


def _as_reported(pod: PodFacts, report: SupervisorReport | None) -> PodFacts:
    if not pod.supervised or pod.state is not PodState.RUNNING or report is None:
        return pod
    if not attempt_ended(report, pod.attempt):
        return pod
    succeeded = report.state is ProcessState.EXITED and report.exit_code == 0
    return dataclasses.replace(
        pod,
        state=PodState.SUCCEEDED if succeeded else PodState.FAILED,
        exit_code=report.exit_code,
        reason="Completed" if succeeded else REASONS.get(report.state, "Error"),
        finished_at=report.ended_at,
        processes_ended=True,
        **termination_facts(report.message, pod.name),
    )
