"""Micro-step packing under zero-signal filtering: run fewer, fuller micro-steps, skip the empty ones.

The state machine lives here; the plan is the pure `grpo_hub.algos.packing.packing_plan`. The trainer's
`training_step` / `_prepare_inputs` overrides delegate to `MicroStepPacker`, passing TRL's methods and state as
callables, so nothing here knows the trainer. Hand-over, per micro-step (TRL 1.16 order, see the trainer's
module docstring):

1. `training_step` (packer) asks for the micro-batch through the trainer's `_prepare_inputs`, which runs TRL's
   `_prepare_inputs` (generating and buffering a new generation batch every steps_per_generation ·
   num_iterations micro-steps) and, when the buffer is new, plans the cycle (`plan`: one all-gather);
2. `next_micro_batch` packs the plan's rows for TRL's `_step`, or returns None for a skipped micro-step;
3. skipped: only `_step` and the window position advance (no forward, backward or collective on any rank);
   else the packed micro-batch is handed to TRL's `training_step`, whose own call to `_prepare_inputs`
   receives it back unchanged (`take_ready`), and which advances `_step`.
"""

from collections.abc import Callable

import torch

from grpo_hub.algos.filtering import keep_rows
from grpo_hub.algos.packing import concat_micro_batches, packed_rows, packing_plan


class MicroStepPacker:
    """Packing state of one trainer: the plan of the buffered generation batch and where the optimizer step is.

    `gather` concatenates a tensor over ranks (dim 0); `metrics` is the train metrics dict (lists of floats).
    """

    def __init__(
        self,
        gather: Callable[[torch.Tensor], torch.Tensor],
        num_iterations: int,
        accumulation_steps: int,
        batch_size: int,
        pad_to_multiple_of: int | None,
        metrics: dict,
    ):
        self.gather = gather
        self.num_iterations = num_iterations
        self.accumulation_steps = accumulation_steps
        self.batch_size = batch_size
        self.pad_to_multiple_of = pad_to_multiple_of
        self.metrics = metrics
        self.plan = None  # per position of the generation cycle: rows to train, or None (skipped)
        self.window_position = 0  # micro-steps of the current optimizer step already run
        self.ready = None  # packed micro-batch handed to transformers' training_step

    @classmethod
    def from_config(cls, args, gather, num_iterations: int, pad_to_multiple_of: int | None, metrics: dict):
        """The packer of a GRPOHubConfig: its accumulation steps and per-device micro-batch size."""
        return cls(
            gather,
            num_iterations,
            args.gradient_accumulation_steps,
            args.per_device_train_batch_size,
            pad_to_multiple_of,
            metrics,
        )

    def training_step(
        self,
        inputs,
        prepare: Callable[[object], dict | None],
        run_step: Callable[[dict], torch.Tensor],
        skip_step: Callable[[], None],
        sync_gradients: Callable[[], bool],
        device,
    ) -> torch.Tensor:
        """One micro-step: `prepare(inputs)` (the trainer's `_prepare_inputs`) gives the packed micro-batch or
        None; None runs nothing (`skip_step` advances TRL's `_step`), else `run_step` runs TRL's training_step.

        The plan is the same on every rank and always runs the micro-step that ends an optimizer step
        (`sync_gradients()`), so DDP's gradient reduction and DeepSpeed's step happen as usual.
        """
        micro_batch = prepare(inputs)  # generates when due, on every rank
        if micro_batch is None:
            if sync_gradients():
                raise RuntimeError("packing plan skipped the micro-step that ends an optimizer step")
            skip_step()
            self.window_position += 1
            return torch.zeros((), device=device)
        self.ready = micro_batch
        loss = run_step(micro_batch)
        self.window_position = 0 if sync_gradients() else self.window_position + 1
        return loss

    def take_ready(self, batch) -> bool:
        """True (once) when `batch` is the micro-batch this packer handed to TRL's training_step."""
        if batch is None or batch is not self.ready:
            return False
        self.ready = None
        return True

    def next_micro_batch(
        self, prepare_trl: Callable[[], object], buffered: Callable[[], list[dict]], step: Callable[[], int]
    ) -> dict | None:
        """Run TRL's `_prepare_inputs` (`prepare_trl`), re-plan if it buffered a new generation batch
        (`buffered()`: TRL's `_buffered_inputs`), and pack the micro-batch of TRL's `_step` (`step()`)."""
        before = buffered()
        prepare_trl()
        if buffered() is not before:  # TRL generated and buffered a new generation batch
            self._plan(buffered())
        entry = self.plan[step() % len(self.plan)]
        if entry is None:
            return None
        slots, chunk, chunks, num_rows = entry
        batches = buffered()
        segment = concat_micro_batches([batches[slot] for slot in slots])
        carrying = segment["completion_mask"].any(dim=1).nonzero().squeeze(1)
        keep = torch.zeros_like(segment["completion_mask"][:, 0], dtype=torch.bool)
        keep[carrying[packed_rows(carrying.numel(), chunk, chunks)]] = True
        return keep_rows(segment, keep, num_rows, self.pad_to_multiple_of)  # same row count on every rank

    def _plan(self, batches: list[dict]) -> None:
        """Agree (one all-gather) on the packing plan of the buffered generation batch; log micro-steps run."""
        rows = torch.stack([b["completion_mask"].any(dim=1).sum() for b in batches])
        rows = self.gather(rows.unsqueeze(0)).cpu()
        self.plan = packing_plan(
            rows, self.num_iterations, self.accumulation_steps, self.window_position, self.batch_size
        )
        self.metrics["zero_signal/micro_steps_run"].append(
            float(sum(entry is not None for entry in self.plan))
        )
