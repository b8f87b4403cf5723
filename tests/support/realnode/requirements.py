"""Whether this machine can run a real node, and if not, the reason a test skips with."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from support.controlplane import CONTROL_PLANE_BINARIES, binary_dir
from support.realnode.hoststate import v1_hierarchies
from support.realnode.node import NODE_BINARIES

HOST_TOOLS = ("containerd", "runc", "ctr", "nsenter", "unshare", "nft", "debootstrap", "umoci",
              "buildah")  # fmt: skip


def unavailable_reason() -> str | None:
    """None when a real node can start here; otherwise what is missing, and what to run."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc, network namespaces, cgroups)"
    missing = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
    if not Path("/usr/lib/cni/bridge").exists():
        missing.append("/usr/lib/cni/bridge")
    if missing:
        return f"missing {', '.join(missing)}: run `make node-runtime` (Debian packages)"
    try:
        node_binaries()
    except RuntimeError as error:
        return str(error)
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlay file system (containerd's overlayfs snapshotter)"
    if not v1_hierarchies():
        return "no cgroup v1 hierarchy is mounted (this node is set up for cgroup v1)"
    probe = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True,
                           text=True, check=False)  # fmt: skip
    if probe.returncode != 0:
        return f"cannot create network and mount namespaces: {probe.stderr.strip()}"
    return None


def node_binaries() -> Path:
    """The directory holding the control plane's and the node's Kubernetes binaries."""
    return binary_dir((*CONTROL_PLANE_BINARIES, *NODE_BINARIES))
