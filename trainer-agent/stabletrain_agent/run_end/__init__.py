"""How a training process tells the kubelet why it ended: `trip_exit` (the trip report of a
run that stopped on purpose, and its exit code) and `write_completion` (the final numbers of
a run that reached its end). Both are read by the operator from the pod's status.
"""
