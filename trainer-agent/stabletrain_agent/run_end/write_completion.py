"""Leaving the completion message (contract/completion.py) where the kubelet reads it."""

from __future__ import annotations

import os
from pathlib import Path

from stabletrain_contract.completion import Completion, render_completion


def leave_completion(path: Path, completion: Completion) -> bool:
    """Write the message, unless the file holds one already; whether it was written.

    A trip report or a restore failure says more about how the process ended than this
    would, and a script that caught either and then closed the guard without an error in
    flight must not replace it. The file is bind-mounted: written in place, no rename.
    """
    if path.exists() and path.stat().st_size > 0:
        return False
    with path.open("w", encoding="utf-8") as handle:
        handle.write(render_completion(completion))
        handle.flush()
        os.fsync(handle.fileno())
    return True
