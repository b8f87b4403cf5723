"""Reading what happened: pod status (exit codes, trip reports, OOM, eviction, lost nodes)
and the agents' status endpoints."""
