"""The life of one pod on a node, in a thread of its own, as the kubelet's pod worker does it.

Sandbox and volumes first, then each container (restarted per restartPolicy with a doubling
back-off), a status write whenever what the node knows changes, and on deletion: SIGTERM, the
pod's grace period, SIGKILL, a last status, and the final delete with grace 0 that removes the
object. Every process of the pod is started from this thread, so they all die with it even if
the test run is killed (see support.processes).
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import urllib3
from kubernetes.client.exceptions import ApiException

from support.localnode.api import ApiError, Json, pod_path
from support.localnode.container import ContainerRun, Mount, now
from support.localnode.context import NodeContext
from support.localnode.env import container_argv, container_env, expand
from support.localnode.namespaces import MARKER_ENV
from support.localnode.probes import ReadinessProber, readiness_settings
from support.localnode.remount import set_read_only
from support.localnode.sandbox import PodSandbox
from support.localnode.sources import PodConfigError
from support.localnode.status import TERMINAL_PHASES, ContainerView, pod_status
from support.localnode.sweep import kill_marked, marked_processes
from support.localnode.volumes import PodVolumes

log = logging.getLogger(__name__)

TICK_SECONDS = 0.1
SYNC_SECONDS = 1.0
STATUS_RECONCILE_SECONDS = 10.0
"""How often a status the API holds differently from the one published is published again,
as a kubelet's status manager does (its periodic sync compares with the API server): the
node controller marks every pod of a node it lost `Ready: False`, and only the node, back
in touch, marks them ready again. Without it a pod kept that mark after an API server
restart, and the operator replaced it at the next recovery as a pod whose node stopped
reporting."""
KUBELET_CONDITIONS = ("Ready", "ContainersReady")
CONFIG_RETRY_SECONDS = 1.0
GONE_GRACE_SECONDS = 2.0
"""A pod deleted behind the node's back (force delete) still gets a short SIGTERM window."""
DEFAULT_GRACE_SECONDS = 30
NO_RESTART = "Never"
"""The restart policy that applies while a pod is being stopped, whatever its own."""
UNSUPPORTED_POD_FIELDS = (
    "initContainers",
    "ephemeralContainers",
    "hostNetwork",
    "hostPID",
    "hostIPC",
)
"""Refused with a message in the container's waiting state rather than silently skipped."""


@dataclass
class _Container:
    spec: Json
    view: ContainerView
    run: ContainerRun | None = None
    next_start: float = 0.0
    prober: ReadinessProber | None = None

    def stop_probing(self) -> None:
        if self.prober is not None:
            self.prober.stop()
            self.prober = None
        self.view.probe_ready = None


def _should_restart(policy: str, exit_code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


class PodWorker:
    def __init__(self, context: NodeContext, pod: Json) -> None:
        self.context = context
        self.uid: str = pod["metadata"]["uid"]
        self.name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self.pod_dir = context.pods_dir / self.uid
        self.marker = f"{context.marker}/{self.uid}/"
        self._pod = pod
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._gone = self._lost = self._shutdown = False
        self._sandbox: PodSandbox | None = None
        self._volumes = PodVolumes(context.api, context.storage, self.pod_dir)
        self._containers = [
            _Container(c, ContainerView(c["name"], c.get("image", "")))
            for c in pod["spec"]["containers"]
        ]
        self._finished = (pod.get("status") or {}).get("phase") in TERMINAL_PHASES
        self._pod_ip = ""
        self._start_time = now()
        self._since: dict[str, tuple[str, str]] = {}
        self._published: Json | None = None
        self._reconciled_at = 0.0
        self._hosts_version = -1
        self._last_sync = 0.0
        self._last_error = ""
        self.thread = threading.Thread(target=self._main, name=f"pod-{self.name}", daemon=True)

    # -- signals from the node -----------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def offer(self, pod: Json) -> None:
        with self._lock:
            self._pod = pod
        self._wake.set()

    def _flag(self, name: str) -> None:
        with self._lock:
            setattr(self, name, True)
        self._wake.set()

    def gone(self) -> None:
        """The pod object disappeared without the node finalizing it."""
        self._flag("_gone")

    def lose(self) -> None:
        """The node died: processes vanish, nothing more reaches the API server."""
        self._flag("_lost")

    def shutdown(self) -> None:
        """The local cluster stops: stop the processes, leave the object to the cluster."""
        self._flag("_shutdown")

    def log_path(self, container: str, run: int) -> Path:
        """Output of one run; kept after the pod is gone, until the cluster stops."""
        directory = f"{self.name.replace('/', '_')}_{self.uid}"
        return self.context.logs_dir / directory / f"{container}-{run}.log"

    # -- the loop ------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._run()
        except Exception:
            log.exception("pod worker %s failed", self.name)
        finally:
            self._teardown()

    def _state(self) -> tuple[Json, bool, bool, bool]:
        with self._lock:
            return self._pod, self._gone, self._lost, self._shutdown

    def _run(self) -> None:
        while True:
            pod, gone, lost, shutdown = self._state()
            if lost:
                return
            if shutdown or gone:
                self._stop_containers(GONE_GRACE_SECONDS)
                return
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(pod)
                return
            if not self._finished:
                self._step_surviving_api_errors(pod)
            self._wake.wait(TICK_SECONDS)
            self._wake.clear()

    def _step_surviving_api_errors(self, pod: Json) -> None:
        """A kubelet keeps its containers running while the API server is unreachable; so
        does this node: the step is retried on the next tick, the error logged once."""
        try:
            self._step(pod)
            self._last_error = ""
        except (ApiError, OSError, urllib3.exceptions.HTTPError, ApiException) as error:
            if str(error) != self._last_error:
                log.warning("pod %s: %s (retrying)", self.name, error)
            self._last_error = str(error)

    def _step(self, pod: Json) -> None:
        if self._sandbox is None and not self._create_sandbox(pod):
            self._publish(pod)
            return
        policy = pod["spec"].get("restartPolicy") or "Always"
        moment = time.monotonic()
        for container in self._containers:
            if container.run is not None:
                self._collect_exit(container, policy, moment)
            elif not container.view.finished and moment >= container.next_start:
                self._start(container, pod)
        if moment - self._last_sync >= SYNC_SECONDS:
            self._last_sync = moment
            self._sync_volumes(pod)
        self._sync_hosts(pod)
        for container in self._containers:
            if container.prober is not None:
                container.view.probe_ready = container.prober.ready
        if all(c.view.finished for c in self._containers):
            self._finished = True
            self._stop_sandbox()
        self._publish(pod)

    def _create_sandbox(self, pod: Json) -> bool:
        unsupported = [f for f in UNSUPPORTED_POD_FIELDS if pod["spec"].get(f)]
        if unsupported:
            for container in self._containers:
                container.view.waiting_reason = "CreateContainerConfigError"
                container.view.waiting_message = (
                    f"{', '.join(unsupported)} not supported by the local node (test support)"
                )
            return False
        try:
            self._volumes.prepare(pod)
        except PodConfigError as error:
            for container in self._containers:
                container.view.waiting_message = f"MountVolume.SetUp failed: {error}"
            return False
        port = f"p{self.uid.replace('-', '')[:12]}"
        self._sandbox = PodSandbox(pod, self.pod_dir, self.context.network, port, self.marker)
        self._pod_ip = self._sandbox.ip
        self._start_time = now()
        for container in self._containers:
            container.view.waiting_message = ""
        return True

    def _collect_exit(self, container: _Container, policy: str, moment: float) -> None:
        assert container.run is not None
        exit_ = container.run.poll()
        if exit_ is None:
            return
        container.run = None
        container.stop_probing()
        view = container.view
        view.running_since = None
        view.exits.append(exit_)
        view.restarts_pending = _should_restart(policy, exit_.exit_code)
        if view.restarts_pending:
            view.waiting_reason = "CrashLoopBackOff"
            delay = self.context.backoff.delay(view.runs)
            view.waiting_message = f"back-off {delay:g}s restarting failed container"
            container.next_start = moment + delay

    def _pod_as_started(self, pod: Json) -> Json:
        """The pod with the fields the node assigns, for the downward API."""
        seen = copy.deepcopy(pod)
        status = seen.setdefault("status", {})
        status["podIP"], status["podIPs"] = self._pod_ip, [{"ip": self._pod_ip}]
        status["hostIP"] = self.context.host_ip
        status["hostIPs"] = [{"ip": self.context.host_ip}]
        return seen

    def _start(self, container: _Container, pod: Json) -> None:
        assert self._sandbox is not None
        view = container.view
        try:
            defaults = {**self.context.base_env, "HOSTNAME": self._sandbox.hostname}
            env = container_env(
                self.context.api, self._pod_as_started(pod), container.spec, defaults
            )
            argv = container_argv(container.spec, env)
            mounts = self._mounts(container.spec, env)
            probe = readiness_settings(container.spec)
        except PodConfigError as error:
            view.waiting_reason, view.waiting_message = "CreateContainerConfigError", str(error)
            container.next_start = time.monotonic() + CONFIG_RETRY_SECONDS
            return
        marker = f"{self.marker}{view.name}/{view.runs}/"
        env[MARKER_ENV] = marker
        run_dir = self.pod_dir / "containers" / view.name / str(view.runs)
        container.run = ContainerRun(
            container.spec, run_dir, log_path=self.log_path(view.name, view.runs),
            sandbox=self._sandbox, mounts=mounts, env=env, argv=argv, marker=marker,
        )  # fmt: skip
        view.runs += 1
        view.running_since = now()
        view.container_id = f"localnode://{container.run.pid}"
        view.restarts_pending = False
        view.waiting_message = ""
        if probe is not None:
            view.probe_ready = False
            container.prober = ReadinessProber(probe, self._pod_ip, self._wake.set)

    def _mounts(self, spec: Json, env: dict[str, str]) -> list[Mount]:
        mounts = []
        for volume_mount in spec.get("volumeMounts") or []:
            source = self._volumes.paths.get(volume_mount["name"])
            if source is None:
                raise PodConfigError(f'volumeMount "{volume_mount["name"]}" names no volume')
            sub_path = volume_mount.get("subPath") or expand(
                volume_mount.get("subPathExpr") or "", env
            )
            if sub_path:
                if sub_path.startswith("/") or ".." in Path(sub_path).parts:
                    raise PodConfigError(f"subPath {sub_path!r} must be relative, without '..'")
                source = source / sub_path
                if not source.exists():
                    source.mkdir(parents=True)
            read_only = bool(volume_mount.get("readOnly"))
            if self._claim_of(volume_mount["name"]) in self.context.read_only_claims:
                read_only = True
            mounts.append(Mount(source, volume_mount["mountPath"], read_only))
        return mounts

    def _claim_of(self, volume_name: str) -> tuple[str, str] | None:
        """(namespace, claim) when the volume of that name is a PersistentVolumeClaim."""
        for volume in self._pod["spec"].get("volumes") or []:
            if volume["name"] == volume_name and "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                return self._pod["metadata"]["namespace"], claim
        return None

    # -- acting on the running pod from outside (fault injection) ------------------------
    def processes(self) -> list[int]:
        """Every process of the pod still alive (its containers' and its sandbox's)."""
        return marked_processes(self.marker)

    def remount_claim(self, claim: tuple[str, str], read_only: bool) -> list[str]:
        """The claim's volume made read-only or writable in every running container of the
        pod (support.localnode.remount); returns "container:mountPath" for each."""
        done = []
        for container in self._containers:
            run = container.run
            if run is None or run.process.popen.poll() is not None:
                continue
            for volume_mount in container.spec.get("volumeMounts") or []:
                if self._claim_of(volume_mount["name"]) != claim:
                    continue
                target = volume_mount["mountPath"]
                try:
                    set_read_only(run.pid, target, read_only)
                except RuntimeError:
                    if run.process.popen.poll() is None and os.path.exists(f"/proc/{run.pid}"):
                        raise
                    # It ended meanwhile (its pid can go before the runtime that waits
                    # on it, as in the long chaos run): nothing left to remount.
                    continue
                done.append(f"{container.view.name}:{target}")
        return done

    def _sync_volumes(self, pod: Json) -> None:
        try:
            self._volumes.sync(pod)
        except (PodConfigError, ApiError) as error:
            log.warning("pod %s: volume sync failed, keeping the old content: %s", self.name, error)

    def _sync_hosts(self, pod: Json) -> None:
        version, endpoints = self.context.endpoints()
        if self._sandbox is not None and version != self._hosts_version:
            self._sandbox.update_hosts(pod, endpoints)
            self._hosts_version = version

    # -- stopping ------------------------------------------------------------------------
    def _stop_containers(self, grace: float) -> None:
        """SIGTERM every running container, SIGKILL what is left after the grace period."""
        running = [c for c in self._containers if c.run is not None]
        for container in running:
            assert container.run is not None
            container.run.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(c.run is not None for c in running) and time.monotonic() < deadline:
            if self._state()[2]:
                return
            for container in running:
                self._collect_exit(container, NO_RESTART, time.monotonic())
            time.sleep(0.05)
        for container in running:
            if container.run is not None:
                container.run.kill()
                self._collect_exit(container, NO_RESTART, time.monotonic())
        for container in self._containers:
            container.view.restarts_pending = False

    def _terminate(self, pod: Json) -> None:
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        self._stop_containers(float(DEFAULT_GRACE_SECONDS if grace is None else grace))
        if self._state()[2]:
            return
        self._finished = True
        self._stop_sandbox()
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}
        while not any(self._state()[1:]):
            try:
                self._publish(pod)
                self.context.api.delete(pod_path(*self.name.split("/")), body)
                return
            except ApiError as error:
                if error.status == 409:  # a newer pod of the same name: not ours to delete
                    return
                log.warning("pod %s: finalizing failed (retrying): %s", self.name, error)
            except (OSError, urllib3.exceptions.HTTPError, ApiException) as error:
                log.warning("pod %s: finalizing failed (retrying): %s", self.name, error)
            time.sleep(TICK_SECONDS)

    def _stop_sandbox(self) -> None:
        if self._sandbox is not None:
            self._sandbox.stop()
            self._sandbox = None

    def _publish(self, pod: Json) -> None:
        if self._state()[2]:
            return
        status = pod_status(
            [c.view for c in self._containers], self._pod_ip, self.context.host_ip,
            self._start_time, now(), since=self._since,
        )  # fmt: skip
        if status == self._published and not self._reconcile_due(pod, status):
            return
        body = {"metadata": {"uid": self.uid}, "status": status}
        try:
            self.context.api.request(
                "PATCH",
                pod_path(*self.name.split("/")) + "/status",
                body,
                content_type="application/strategic-merge-patch+json",
            )
            self._published = status
            self._reconciled_at = time.monotonic()
        except ApiError as error:
            if error.status != 404:
                raise
            self.gone()

    def _reconcile_due(self, pod: Json, status: Json) -> bool:
        """The API's kubelet-owned conditions differ from the ones published, and the last
        publish was STATUS_RECONCILE_SECONDS ago (the watch may not have brought it yet)."""
        if time.monotonic() - self._reconciled_at < STATUS_RECONCILE_SECONDS:
            return False

        def owned(conditions: list[Json]) -> dict[str, str | None]:
            return {
                c["type"]: c.get("status")
                for c in conditions
                if c.get("type") in KUBELET_CONDITIONS
            }

        held = owned((pod.get("status") or {}).get("conditions") or [])
        return held != owned(status.get("conditions") or [])

    def _teardown(self) -> None:
        for container in self._containers:
            container.stop_probing()
            if container.run is not None:
                container.run.kill()
                container.run.process.stop(grace=0)
        kill_marked(self.marker)
        self._stop_sandbox()
        self._volumes.remove_pod_local()
        shutil.rmtree(self.pod_dir, ignore_errors=True)

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
