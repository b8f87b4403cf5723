"""What the operator puts into every training container's environment, by name, and the
variables of torchrun's that either side uses: every env name of either side is here.

Env vars are fixed for a pod's life, which is exactly right for per-attempt facts (the
attempt number fences everything the pod writes and accepts). Anything that changes during
an attempt arrives through the live-directive channel instead (see channel.py).
"""

from __future__ import annotations

from pathlib import PurePosixPath

JOB_NAME = "STABLETRAIN_JOB_NAME"
"""Name of the StableTrainingJob, for the training script's own use (run names, logs); the
agent does not read it."""
JOB_NAMESPACE = "STABLETRAIN_JOB_NAMESPACE"
"""Its namespace."""
ATTEMPT = "STABLETRAIN_ATTEMPT"
"""Attempt number (0, 1, ...): checkpoints carry it, directives for another attempt are refused."""
NODE_NAME = "STABLETRAIN_NODE_NAME"
"""The Kubernetes node (downward API spec.nodeName): names the local tier in inventories."""
POD_NAME = "STABLETRAIN_POD_NAME"
"""The pod's own name (downward API metadata.name): names the memory tier's copies in
inventories, because that tier lives and dies with the pod, not with the node."""
NODE_RANK = "STABLETRAIN_NODE_RANK"
"""torchrun's node rank of this pod (0 .. nodes-1)."""
NODES = "STABLETRAIN_NODES"
"""Pods in the job (torchrun --nnodes)."""
PROCESSES_PER_NODE = "STABLETRAIN_PROCESSES_PER_NODE"
"""Ranks per pod (torchrun --nproc-per-node)."""

LOCAL_CHECKPOINT_DIR = "STABLETRAIN_LOCAL_CHECKPOINT_DIR"
"""Node-local tier (NVMe via hostPath or a local volume), mounted into the container."""
PFS_CHECKPOINT_DIR = "STABLETRAIN_PFS_CHECKPOINT_DIR"
"""Shared tier (the PFS claim), the same content on every node."""
MEMORY_CHECKPOINT_DIR = "STABLETRAIN_MEMORY_CHECKPOINT_DIR"
"""The pod's memory tier (an emptyDir of medium Memory): survives a restart of the training
processes inside the pod, lost with the pod; unset when spec.checkpoints.memory is off."""
LINEAGE_DIR = "STABLETRAIN_LINEAGE_DIR"
"""Where on the PFS the agent writes spike-window lineage; trip reports point into it."""

CHECKPOINT_INTERVAL_STEPS = "STABLETRAIN_CHECKPOINT_INTERVAL_STEPS"
"""spec.checkpoints.intervalSteps: the manager's save step is every multiple of it."""
LOCAL_RETENTION = "STABLETRAIN_LOCAL_RETENTION"
"""spec.checkpoints.local.retention: regular checkpoints kept on each node's local tier."""
PFS_RETENTION = "STABLETRAIN_PFS_RETENTION"
"""spec.checkpoints.pfs.retention: regular checkpoints kept on the PFS."""
SPIKE_MARKERS = "STABLETRAIN_SPIKE_MARKERS"
"""spec.checkpoints.spikeMarkers: checkpoints from inside an anomaly kept as evidence."""
LOCAL_SIZE_LIMIT_BYTES = "STABLETRAIN_LOCAL_SIZE_LIMIT_BYTES"
"""spec.checkpoints.local.sizeLimit in bytes; unset means no budget beyond the retention."""
MEMORY_INTERVAL_STEPS = "STABLETRAIN_MEMORY_INTERVAL_STEPS"
"""spec.checkpoints.memory.intervalSteps: the manager snapshots into the memory tier at every
multiple of it (between the local saves); 0 turns the tier off."""

DIRECTIVES_PATH = "STABLETRAIN_DIRECTIVES_PATH"
"""File holding the attempt's initial Directives JSON (from a ConfigMap the operator writes
before it creates the pods, so it is there at start; later changes go over HTTP)."""
DIRECTIVES_TOKEN = "STABLETRAIN_DIRECTIVES_TOKEN"
"""Bearer token for the live-directive endpoint (secretKeyRef into the per-job Secret)."""
CHECKPOINT_KEY = "STABLETRAIN_CHECKPOINT_KEY"
"""The job's checkpoint key (secretKeyRef into the per-job Secret): every manifest the job
writes is signed with it, and a copy whose signature does not verify is never loaded. Unset
(a job whose Secret predates signing, a run outside the operator): manifests are written
unsigned and only unsigned ones are read (docs/operations.md, "Multi-tenant clusters")."""
AGENT_PORT = "STABLETRAIN_AGENT_PORT"
"""Port of the agent's HTTP server (/metrics, status, live directives) on local rank 0."""
AGENT_BIND_ADDRESS = "STABLETRAIN_AGENT_BIND_ADDRESS"
"""Address that server binds to: the pod IP (downward API status.podIP) in a cluster, a
loopback address in tests; unset means every interface of the pod."""
TERMINATION_MESSAGE_PATH = "STABLETRAIN_TERMINATION_MESSAGE_PATH"
"""Where the trip report goes; equal to the container's terminationMessagePath."""
AGENT_LOCAL_PORT = "STABLETRAIN_AGENT_LOCAL_PORT"
"""With a supervisor in the pod (restart InPlace): the port on 127.0.0.1 the training agent
serves on behind it; the supervisor owns STABLETRAIN_AGENT_PORT on the pod IP."""
SUPERVISOR_RUN_DIR = "STABLETRAIN_SUPERVISOR_RUN_DIR"
"""Where the supervisor writes the directives of the attempts it starts in the pod."""
WARM_START = "STABLETRAIN_WARM_START"
"""spec.recovery.warmStart: 1 (default) keeps a standby torchrun with its workers' imports
done for the next attempt started in the pod; 0 starts every attempt cold."""
GRACE_SECONDS = "STABLETRAIN_GRACE_SECONDS"
"""The pod's termination grace period: how long the supervisor gives the training processes
after forwarding the pod's TERM before it KILLs them (just before the kubelet would)."""

PREFLIGHT_ENV = "STABLETRAIN_PREFLIGHT"
"""Set to 1 in the preflight pod: Guard.from_env gathers the facts, leaves them as the
termination message and exits 0 before the first step."""

DEFAULT_DIRECTIVES_DIR = PurePosixPath("/etc/stabletrain/directives")
DIRECTIVES_FILE_KEY = "directives.json"
"""ConfigMap key and file name of the initial directives."""
DEFAULT_DIRECTIVES_PATH = DEFAULT_DIRECTIVES_DIR / DIRECTIVES_FILE_KEY
DEFAULT_LOCAL_CHECKPOINT_DIR = PurePosixPath("/stabletrain/local")
DEFAULT_PFS_CHECKPOINT_DIR = PurePosixPath("/stabletrain/pfs")
DEFAULT_MEMORY_CHECKPOINT_DIR = PurePosixPath("/stabletrain/memory")
DEFAULT_TERMINATION_MESSAGE_PATH = PurePosixPath("/dev/termination-log")
"""Kubernetes' default terminationMessagePath."""
DEFAULT_CHECKPOINT_INTERVAL_STEPS = 500
DEFAULT_RETENTION = 3
DEFAULT_SPIKE_MARKERS = 2
DEFAULT_MEMORY_INTERVAL_STEPS = 10
"""What the agent assumes when a checkpoint variable is unset: the spec's defaults."""
DEFAULT_AGENT_PORT = 9400
DEFAULT_SUPERVISOR_RUN_DIR = PurePosixPath("/stabletrain/run")
DEFAULT_AGENT_BIND_ADDRESS = "0.0.0.0"

TOKEN_SECRET_KEY = "token"
"""Key of the token inside the per-job Secret."""
CHECKPOINT_KEY_SECRET_KEY = "checkpointKey"
"""Key of the checkpoint key inside the same Secret."""

# torchrun's options as the operator sets them: torchrun reads PET_<OPTION> for every option
# not given on its command line (torch 2.9, torch/distributed/argparse_util.py).
PET_NNODES = "PET_NNODES"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_NODE_RANK = "PET_NODE_RANK"
PET_RDZV_BACKEND = "PET_RDZV_BACKEND"
PET_RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"
PET_RDZV_ID = "PET_RDZV_ID"
PET_RDZV_CONF = "PET_RDZV_CONF"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
PET_MAX_RESTARTS = "PET_MAX_RESTARTS"
PET_LOCAL_ADDR = "PET_LOCAL_ADDR"

# What torchrun sets in every worker process it starts; the agent reads them.
LOCAL_RANK = "LOCAL_RANK"
"""The process's rank within its pod: only local rank 0 serves HTTP and writes the pod's
termination message."""
RANK = "RANK"
"""The process's global rank: the heartbeat names it."""
WORLD_SIZE = "WORLD_SIZE"
"""Processes in the job; absent outside torchrun, where the run is one process."""
GROUP_RANK = "GROUP_RANK"
"""torchrun's node rank: the checkpoint manager's fallback when the operator did not set
STABLETRAIN_NODE_RANK (stable only with the static rendezvous, which keeps --node-rank)."""
