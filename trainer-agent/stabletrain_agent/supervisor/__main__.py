"""`stabletrain-supervisor [--] COMMAND [ARG...]`: run the job's command in this pod, attempt
after attempt (see the package docstring)."""

from __future__ import annotations

import sys

from stabletrain_agent.supervisor.run import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
