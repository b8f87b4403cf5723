"""Warm starts: interpreters that did their heavy imports before an attempt needs them.

A restart in place keeps the pod, but a cold start of the next attempt still pays an
interpreter and `import torch` twice over (torchrun's own, then each worker's): seconds of
CPU before any training code runs, the largest part of a restart's process start. The
supervisor therefore keeps a standby launcher (`launcher.py`: torchrun with torch imported)
for the next attempt, and that standby keeps one standby worker per local rank
(`worker.py`: torch and the agent imported). When the next attempt starts, the supervisor
hands its command and environment to the standby launcher instead of starting torchrun,
and torchrun hands each worker's command line to a standby worker instead of starting an
interpreter. Each standby waits on its stdin for one order (`order.py`), then becomes the
process it stands in for. Anything it cannot stand in for (another launcher, `--no-python`,
more workers than standbys) starts cold, as before.
"""
