"""Adapters that make common training objects checkpointable by the manager.

The manager takes anything with `state_dict()` / `load_state_dict()`.  Model and optimizer
go through torch.distributed.checkpoint's state-dict helpers because a fresh optimizer has
no state to load into (its state is created lazily at the first step) and parameters are
keyed by id, not by name; the helpers give fully-qualified names and pre-created state.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class ModelOptimizerState:
    """Model and optimizer as one entry, with parameter names as keys."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optimizer_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optimizer"],
        )


class RngState:
    """This rank's random generators: restored per rank so a resumed run draws the same."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        random.setstate(state_dict["python"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state(state_dict["cuda"])
