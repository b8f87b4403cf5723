"""The demo's way in: `python -m support.localnode` runs pods until SIGTERM, then cleans up."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client

from support.controlplane import ControlPlane
from support.localnode.api import RawApi
from support.localnode.sweep import marked_processes
from support.localnode.testing import create, pod_manifest, read_pod, wait_for
from support.processes import ManagedProcess

TESTS = Path(__file__).resolve().parents[1]


def test_standalone_runs_pods_and_stops_cleanly_on_sigterm(
    control_plane: ControlPlane, api_client: client.ApiClient, pod_namespace: str, tmp_path: Path
) -> None:
    root = tmp_path / "cluster"
    argv = [sys.executable, "-m", "support.localnode", f"--kubeconfig={control_plane.kubeconfig}",
            "--nodes=demo-a", f"--root={root}"]  # fmt: skip
    process = ManagedProcess("localnode", argv, tmp_path / "localnode.log", cwd=TESTS)
    try:
        up = wait_for(lambda: re.search(r"link (\S+)\); marker (\S+);", process.log_tail()),
                      30, "the standalone cluster to come up")  # fmt: skip
        link, marker = up.group(1), up.group(2)
        api = RawApi(api_client)
        mounts = [{"name": "nvme", "mountPath": "/nvme"}]
        manifest = pod_manifest("demo", ["sh", "-c", "echo -n kept > /nvme/f; sleep 3600"],
                                volumes=[{"name": "nvme", "hostPath": {"path": "/mnt/nvme"}}],
                                container={"volumeMounts": mounts})  # fmt: skip
        create(api, pod_namespace, "pods", manifest)
        written = root / "nodes" / "demo-a" / "host" / "mnt" / "nvme" / "f"
        wait_for(written.exists, 30, "the pod to write to its hostPath")
        assert marked_processes(marker)

        began = time.monotonic()
        process.popen.send_signal(signal.SIGTERM)
        assert process.popen.wait(timeout=30) == 0, process.log_tail()
        print(f"standalone cluster stopped {time.monotonic() - began:.1f} s after SIGTERM")
    finally:
        process.stop()
    assert "local cluster stopped" in process.log_tail()
    assert marked_processes(marker) == []
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True)
    assert link not in links.stdout
    assert api.get("/api/v1/nodes/demo-a") is None
    assert read_pod(api, pod_namespace, "demo") is None
    assert written.read_text() == "kept"
    assert not (root / "nodes" / "demo-a" / "pods").exists()
