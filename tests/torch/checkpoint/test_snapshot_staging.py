"""The memory tier's staging: a copy of every tensor into buffers kept for the run, taken
on the training thread; what training does next never reaches a staged snapshot."""

from __future__ import annotations

import torch

from stabletrain_agent.checkpoint.snapshot import CopyIntoBuffers


class Marked(torch.Tensor):
    """A tensor subclass, as DTensor is: DCP's own stager copies those."""


def state(value: float) -> dict[str, object]:
    return {
        "train": {"model": {"w": torch.full((4, 3), value), "b": torch.zeros(3)}},
        "guard": {"global_step": int(value), "monitor": f"{{'seen': {value}}}"},
        "rng": [torch.tensor([1, 2, 3], dtype=torch.uint8), (7, "x")],
    }


def test_staging_copies_into_the_same_buffers_every_time() -> None:
    stager = CopyIntoBuffers()
    source = state(1.0)
    first = stager.stage(source)
    weights = source["train"]["model"]["w"]  # type: ignore[index]
    weights.add_(5.0)  # the next optimizer step, after the snapshot was staged
    assert torch.equal(first["train"]["model"]["w"], torch.full((4, 3), 1.0))
    assert first["guard"] == {"global_step": 1, "monitor": "{'seen': 1.0}"}
    assert first["rng"][1] == (7, "x")
    buffer = first["train"]["model"]["w"]
    second = stager.stage(source)
    assert second["train"]["model"]["w"] is buffer, "no allocation after the first snapshot"
    assert torch.equal(buffer, torch.full((4, 3), 6.0))


def test_a_tensor_of_another_shape_gets_a_new_buffer() -> None:
    stager = CopyIntoBuffers()
    first = stager.stage({"a": torch.zeros(2)})["a"]
    second = stager.stage({"a": torch.ones(5, dtype=torch.float64)})["a"]
    assert second is not first
    assert (second.shape, second.dtype) == (torch.Size([5]), torch.float64)


def test_tensor_subclasses_go_through_dcps_stager() -> None:
    stager = CopyIntoBuffers()
    marked = torch.arange(6.0).as_subclass(Marked)
    staged = stager.stage({"sharded": marked, "plain": torch.ones(2)})
    assert torch.equal(staged["sharded"], torch.arange(6.0))
    assert staged["sharded"].data_ptr() != marked.data_ptr()
    marked.add_(1.0)
    assert torch.equal(staged["sharded"], torch.arange(6.0))
