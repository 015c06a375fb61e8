"""Helpers that several wings use under DDP / DeepSpeed: ZeRO-3 gathers, rank-0 broadcasts, unwrapping.

Torch (+ DeepSpeed and PEFT, imported only when needed); no trainer: each takes the tensors or model it acts on.
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def gathered(params: list[torch.Tensor], modifier_rank: int | None = None):
    """Gather ZeRO-3 partitions of `params` for the block (no-op when none is partitioned).

    With `modifier_rank=0`, rank 0's values are broadcast and re-partitioned on exit.
    """
    if not any(hasattr(p, "ds_id") for p in params):
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank):
        yield


def broadcast_unpartitioned(tensors: list[torch.Tensor]) -> None:
    """Broadcast from rank 0 the tensors that ZeRO-3 does not own, so every rank holds identical values."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if torch.distributed.get_world_size() == 1:
        return
    for tensor in tensors:
        if not hasattr(tensor, "ds_id"):
            torch.distributed.broadcast(tensor.data, src=0)


def unwrap_peft_model(model):
    """Peel DDP / DeepSpeed engine wrappers (`.module`) until the PeftModel is reached."""
    from peft import PeftModel

    while not isinstance(model, PeftModel) and hasattr(model, "module"):
        model = model.module
    return model
