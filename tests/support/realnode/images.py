"""The node's images: built (or found cached) by hack/images.sh, imported into containerd."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
IMAGES_SCRIPT = REPO / "hack" / "images.sh"


@dataclass(frozen=True)
class Image:
    name: str
    reference: str
    archive: Path
    size_bytes: int

    @property
    def repository(self) -> str:
        return self.reference.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.reference.rsplit(":", 1)[1]


def build_images(names: tuple[str, ...]) -> dict[str, Image]:
    """These images (of base, pause, operator), rebuilt by the script when their inputs
    changed: a node without the operator never waits for the operator image."""
    done = subprocess.run(
        ["bash", str(IMAGES_SCRIPT), *names], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{IMAGES_SCRIPT} failed:\n{done.stderr[-4000:]}")
    images = {}
    for line in done.stdout.splitlines():
        name, reference, archive, size = line.split("\t")
        images[name] = Image(name, reference, Path(archive), int(size))
    return images


def import_images(socket: Path, images: dict[str, Image]) -> float:
    """Loads the archives into containerd's CRI namespace; returns the seconds it took."""
    began = time.monotonic()
    for image in images.values():
        done = subprocess.run(
            ["ctr", f"--address={socket}", "--namespace=k8s.io", "images", "import",
             f"--base-name={image.repository}", str(image.archive)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"importing {image.reference} failed: {done.stderr.strip()}")
    listed = subprocess.run(
        ["ctr", f"--address={socket}", "--namespace=k8s.io", "images", "ls", "-q"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    missing = [image.reference for image in images.values() if image.reference not in listed]
    if missing:
        raise RuntimeError(f"containerd lists no {missing} after the import (it has {listed})")
    return time.monotonic() - began
