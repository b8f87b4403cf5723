"""Whether the job's name can name everything the operator makes for it.

The headless Service is named after the job, so the name must be a DNS-1035 label (a dot,
or a leading digit, made its creation fail with 422 on every tick); each pod's hostname
is `<job>-a<attempt>-<rank>` and grows with the attempt, so a long name that fits today
stops fitting after enough restarts. New jobs are held to JOB_NAME_MAX by a CEL rule
at admission; these checks also cover jobs created before it, and attempts beyond it.
"""

from __future__ import annotations

import re

from stabletrain_operator import naming
from stabletrain_operator.api.constants import JOB_NAME_MAX, Reason
from stabletrain_operator.preflight.preflight_pod import preflight_pod_name
from stabletrain_operator.tenancy.problems import SpecProblem

DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
FIELD = "metadata.name"


def _too_long(hostname: str, what: str) -> SpecProblem | None:
    if len(hostname) <= naming.HOSTNAME_MAX:
        return None
    return SpecProblem(
        FIELD,
        Reason.NAME_NOT_USABLE,
        f"{what} would have the hostname {hostname!r}, {len(hostname)} characters, over the "
        f"{naming.HOSTNAME_MAX} a hostname may have (a job name of at most "
        f"{JOB_NAME_MAX} characters always fits)",
    )


def name_problems(
    job: str, *, nodes: int, attempt: int, preflight_generation: int | None = None
) -> list[SpecProblem]:
    """Problems of the name for the Service and for the pods of `attempt` (and for the
    preflight pod of that spec generation, when one is made)."""
    if len(job) > naming.HOSTNAME_MAX or not DNS_1035_LABEL.fullmatch(job):
        return [
            SpecProblem(
                FIELD,
                Reason.NAME_NOT_USABLE,
                f"{job!r} cannot name the job's headless Service: it must be a DNS-1035 "
                "label (lowercase letters, digits and '-', starting with a letter, at most "
                f"{naming.HOSTNAME_MAX} characters); recreate the job under such a name",
            )
        ]
    candidates = [(naming.pod_name(job, attempt, nodes - 1), f"attempt {attempt}'s last pod")]
    if preflight_generation is not None:
        candidates.append((preflight_pod_name(job, preflight_generation), "the preflight pod"))
    return [p for name, what in candidates if (p := _too_long(name, what)) is not None]
