"""Turns a fresh mount namespace into a container's filesystem view, then execs its command.

Runs as `python -I -S container_init.py SPEC.json` inside `unshare --mount`, already inside the
pod's network, UTS and PID namespaces (so /proc is the pod's own), and therefore imports only
the standard library. The "image"
is the host's own filesystem: every top-level directory is bind-mounted into a tmpfs root, while
/dev, /run and /tmp are private to the container, so mount points that do not exist on the host
are made in the container's own tmpfs and never on the host. Every mount lives in this mount
namespace only and vanishes with the container's last process.

On any failure before the command runs, the reason goes to the spec's `startErrorPath` and the
exit code is 128, which the node reports as `StartError`, as containerd does.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path
from typing import Any

START_ERROR_EXIT_CODE = 128
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC = 4096, 16384
PRIVATE_TOP_LEVEL = ("dev", "run", "tmp")
NOT_FROM_HOST = ("proc", "sys", "dev", "run", "tmp", "lost+found")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
STAGING = "/run/.localnode-volumes"
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: Path, fstype: str | None, flags: int, data: str = "") -> None:
    result = _libc.mount(
        source.encode(), str(target).encode(), fstype.encode() if fstype else None, flags,
        data.encode() if data else None,
    )  # fmt: skip
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _bind(source: Path, target: Path, read_only: bool = False, recursive: bool = False) -> None:
    _mount(str(source), target, None, MS_BIND | (MS_REC if recursive else 0))
    if read_only:
        _mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def _mirror_host(root: Path) -> None:
    for entry in os.scandir("/"):
        if entry.name in NOT_FROM_HOST:
            continue
        target = root / entry.name
        if entry.is_symlink():
            target.symlink_to(os.readlink(entry.path))
        elif entry.is_dir():
            target.mkdir()
            _bind(Path(entry.path), target)
        elif entry.is_file():
            target.touch()
            _bind(Path(entry.path), target)
    (root / "proc").mkdir()
    _mount("proc", root / "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    (root / "sys").mkdir()
    _bind(Path("/sys"), root / "sys", recursive=True)


def _private_dev(root: Path) -> None:
    dev = root / "dev"
    dev.mkdir()
    _mount("tmpfs", dev, "tmpfs", 0, "mode=755")
    for name in DEVICES:
        (dev / name).touch()
        _bind(Path("/dev") / name, dev / name)
    (dev / "shm").mkdir()
    _mount("shm", dev / "shm", "tmpfs", 0, "mode=1777")
    (dev / "pts").mkdir()
    _bind(Path("/dev/pts"), dev / "pts")
    (dev / "ptmx").symlink_to("pts/ptmx")
    (dev / "fd").symlink_to("/proc/self/fd")
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        (dev / name).symlink_to(f"/proc/self/fd/{number}")


def _mount_point(path: str, is_dir: bool, owned: list[str]) -> str:
    """The target, made only where the container, not the host, owns the parent directory.

    Called inside the chroot, so symlinks such as /var/run -> /run resolve as the container
    sees them.
    """
    target = os.path.realpath(path)
    if os.path.exists(target):
        if os.path.isdir(target) != is_dir:
            kind = "a directory" if is_dir else "a file"
            raise RuntimeError(f"mountPath {path}: must be {kind} to mount this volume")
        return target
    ancestor = os.path.dirname(target)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    inside = any(ancestor == o or ancestor.startswith(o.rstrip("/") + "/") for o in owned)
    if ancestor != "/" and not inside:
        raise RuntimeError(
            f"mountPath {path} does not exist in the image (this host's filesystem) and "
            f"{ancestor} belongs to the host; use a new top-level directory, a path under "
            "/run, /tmp or /dev, or a path that exists on the host"
        )
    if is_dir:
        os.makedirs(target)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        Path(target).touch()
    return target


def build_root(spec: dict[str, Any]) -> list[tuple[Path, dict[str, Any]]]:
    """The root with the host mirrored in; each volume staged under /run until the chroot."""
    root = Path(spec["rootfs"])
    _mount("tmpfs", root, "tmpfs", 0, "mode=755")
    _mirror_host(root)
    _private_dev(root)
    (root / "run").mkdir()
    _mount("tmpfs", root / "run", "tmpfs", 0, "mode=755")
    (root / "tmp").mkdir(mode=0o1777)
    _bind(Path(spec["tmp"]), root / "tmp")
    staged = []
    (root / STAGING.lstrip("/")).mkdir()
    for number, mount in enumerate(spec["mounts"]):
        source = Path(mount["source"])
        stage = root / STAGING.lstrip("/") / str(number)
        if source.is_dir():
            stage.mkdir()
        else:
            stage.touch()
        _bind(source, stage)
        staged.append((Path(STAGING) / str(number), mount))
    return staged


def mount_volumes(staged: list[tuple[Path, dict[str, Any]]]) -> None:
    owned = [f"/{name}" for name in PRIVATE_TOP_LEVEL]
    for stage, mount in sorted(staged, key=lambda s: s[1]["target"].count("/")):
        target = _mount_point(mount["target"], stage.is_dir(), owned)
        _bind(stage, Path(target), read_only=mount.get("readOnly", False))
        owned.append(target)
    for stage, _ in staged:
        _libc.umount2(str(stage).encode(), MNT_DETACH)
    for stage, _ in staged:
        if stage.is_dir():
            stage.rmdir()
        else:
            stage.unlink()
    os.rmdir(STAGING)


def main(spec_path: str) -> None:
    # A process group of its own: the node signals the container's group, never nsenter,
    # which waits outside and relays the exit status.
    os.setsid()
    spec = json.loads(Path(spec_path).read_text())
    # Opened before chroot: afterwards the host path is out of reach.
    with Path(spec["startErrorPath"]).open("w") as start_error:
        stage = "setting up the container's filesystem"
        try:
            staged = build_root(spec)
            os.chroot(spec["rootfs"])
            os.chdir("/")
            mount_volumes(staged)
            stage = f"entering workingDir {spec.get('workingDir') or '/'}"
            os.chdir(spec.get("workingDir") or "/")
            argv = spec["argv"]
            stage = f'exec: "{argv[0]}"'
            os.execvpe(argv[0], argv, os.environ)
        except (OSError, RuntimeError) as error:
            message = f"{stage}: {error}"
            if isinstance(error, FileNotFoundError) and stage.startswith("exec"):
                message = f"{stage}: executable file not found in $PATH"
            start_error.write(message)
            start_error.flush()
            print(f"container start failed: {message}", file=sys.stderr)
            sys.exit(START_ERROR_EXIT_CODE)


if __name__ == "__main__":
    main(sys.argv[1])
