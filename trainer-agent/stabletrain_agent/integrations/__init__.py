"""Thin adapters for the loops users already have: PyTorch Lightning and the HF Trainer.

Each module imports its framework, so importing this package imports neither; install the
``stabletrain[lightning]`` or ``stabletrain[hf]`` extra for the one a job uses. Both share
``core``: the guard on the framework's optimizer step, the directed restore, and the save
that marks a checkpoint stable or a spike marker from the guard's verdict.
"""
