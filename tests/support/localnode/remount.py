"""A volume of a running container made read-only, or writable again, from the outside.

Root ignores permissions, so only a read-only mount really refuses writes. Each container
has its own mount namespace (container_init.py), so the change is made inside it:
`nsenter --mount --root` into the container's main process, then util-linux `mount`.

Going read-only stacks a new bind mount of the volume on its own mount point and makes that
one read-only: a plain remount of the container's mount would fail with EBUSY while any file
on it is open for writing (the kernel counts writers per mount), and the open files (a log
being appended to) keep writing to the mount below, as they would to a file system that
turned read-only under them only if they reopened. Every new open, create, rename or mkdir
sees the read-only mount. Going writable remounts the top mount read-write (a container
started during the outage got its volume read-only directly, and the same remount frees it).
"""

from __future__ import annotations

import subprocess

NSENTER_SECONDS = 10.0


def _in_container(pid: int, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nsenter", "-t", str(pid), "--mount", "--root", "--", *argv],
        capture_output=True, text=True, timeout=NSENTER_SECONDS, check=False,
    )  # fmt: skip


def mount_state(pid: int, target: str) -> str | None:
    """ "ro" or "rw" for the topmost mount at `target` as the process sees it (None: none)."""
    try:
        with open(f"/proc/{pid}/mountinfo") as mountinfo:
            lines = mountinfo.read().splitlines()
    except OSError:
        return None
    state = None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[4] == target:
            state = fields[5].split(",")[0]
    return state


def set_read_only(pid: int, target: str, read_only: bool) -> str:
    """Makes the container's mount at `target` read-only or writable; returns what its
    mountinfo says afterwards ("ro"/"rw"), raising with mount's words if that did not work."""
    steps: list[tuple[str, ...]] = (
        [("mount", "--bind", target, target), ("mount", "-o", "remount,bind,ro", target)]
        if read_only
        else [("mount", "-o", "remount,bind,rw", target)]
    )
    if read_only and mount_state(pid, target) == "ro":
        steps = []
    for argv in steps:
        done = _in_container(pid, *argv)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} in the mount namespace of pid {pid} failed: "
                f"{(done.stderr or done.stdout).strip()}"
            )
    state = mount_state(pid, target)
    wanted = "ro" if read_only else "rw"
    if state != wanted:
        raise RuntimeError(f"pid {pid}: {target} is {state} after the remount, not {wanted}")
    return state
