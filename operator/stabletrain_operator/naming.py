"""Every name and label the operator gives the objects it creates for a job.

Names are deterministic functions of the job, the attempt and the rank, so a create that is
retried (an operator killed between the create and its status write) finds the object it
made before (HTTP 409) instead of making a second one: that is what keeps rollbacks free of
duplicate pods without any bookkeeping.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from stabletrain_operator.api.constants import GROUP

JOB_LABEL = f"{GROUP}/job"
ATTEMPT_LABEL = f"{GROUP}/attempt"
RANK_LABEL = f"{GROUP}/rank"
RESTART_LABEL = f"{GROUP}/restart"
"""On pods whose training command runs under the supervisor (value IN_PLACE): recoveries
restart their processes instead of replacing them."""
IN_PLACE = "InPlace"
POD_SHAPE_ANNOTATION = f"{GROUP}/pod-shape"
"""A digest of the spec fields a pod is built from: a pod whose shape differs from the
current spec's is replaced, not restarted in place."""
DIRECTIVES_GENERATION_ANNOTATION = f"{GROUP}/directives-generation"
AGENT_PORT_NAME = "st-agent"
"""Name of the agent's container port on every worker pod (and of the Service's port)."""
HOSTNAME_MAX = 63
"""A pod's hostname is a DNS label: the API server refuses a longer one."""


def service_name(job: str) -> str:
    """The headless Service: pods are `<pod>.<service>` in cluster DNS (their subdomain)."""
    return job


def pod_name(job: str, attempt: int, rank: int) -> str:
    return f"{job}-a{attempt}-{rank}"


def rendezvous_id(job: str, attempt: int) -> str:
    """torchrun's rendezvous id: an old attempt's straggler can never join the new one."""
    return f"{job}-{attempt}"


def directives_config_map(job: str, attempt: int) -> str:
    return f"{job}-a{attempt}-directives"


def skip_ranges_config_map(job: str) -> str:
    """Holds the full skip list once it outgrows the inline limit of status."""
    return f"{job}-skip-ranges"


def token_secret(job: str) -> str:
    return f"{job}-token"


def network_policy(job: str) -> str:
    """The job's own NetworkPolicy (tenancy/network_policy.py)."""
    return f"{job}-network"


def local_tier_host_path(prefix: str, namespace: str, job: str) -> str:
    """The job's own directory on a node: `<prefix>/<namespace>/<job>`, below the node
    directory its spec names, so two jobs never share one."""
    return str(PurePosixPath(prefix) / namespace / job)


def pod_dns_name(job: str, pod: str, namespace: str) -> str:
    """The per-pod name the headless Service publishes (hostname.subdomain.namespace.svc):
    the pod's name is its hostname. An attempt restarted in place runs in pods named after
    the attempt that created them, so the name is passed, not derived."""
    return f"{pod}.{service_name(job)}.{namespace}.svc"


def job_selector(job: str) -> str:
    return f"{JOB_LABEL}={job}"


def attempt_labels(job: str, attempt: int) -> dict[str, str]:
    return {JOB_LABEL: job, ATTEMPT_LABEL: str(attempt)}
