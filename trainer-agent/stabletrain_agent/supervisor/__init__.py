"""The supervisor: a process in every worker pod that outlives the training processes.

With `spec.recovery.restart: InPlace` the operator runs each worker container's command as
`stabletrain-supervisor -- <command>`. The supervisor starts the command (torchrun), passes
its output through, reaps every process, forwards the pod's TERM, and on the operator's
word stops the attempt's processes (TERM, grace, KILL) and starts the next attempt in the
same pod with that attempt's directives and rendezvous: a recovery keeps the pods, their
scheduling, volumes, images and node-local state, and restarts only the processes. It
serves the pod's agent port in front of the training agent, so the pod answers while no
training process does. Torch-free: it never imports torch itself (standby.py's interpreter
does, in a process of its own).
"""
