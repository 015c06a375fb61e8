"""The trainer's epoch iterator read in whole generation batches, for dynamic sampling and selective rollout.

TRL's train dataloader yields one *generation batch* per micro-step, each repeated
`steps_per_generation * num_iterations` times in a row (RepeatSampler), and transformers pulls one optimizer
step's worth of items from the epoch iterator before the step (`Trainer.get_batch_samples`).
`GenerationBatchStream` is told every pull from that same iterator and takes the NEXT generation batch from it,
consuming exactly one period of items so TRL's generation micro-steps stay aligned with the first item of a
batch.

Resume: a step consumes more than one generation batch, so transformers' resume arithmetic (steps per epoch
assuming one) lands in the wrong epoch at the wrong position. The stream knows where it is (epoch, items
consumed from the epoch's iterator, whether it ran out); `BatchStreamCallback` saves that in every checkpoint,
`GRPOHubTrainer._init_training_state` resumes transformers at the saved epoch (the next one if it had run out)
with nothing to skip, and the stream skips the consumed items before transformers' first pull.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import islice

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import has_length

STATE_FILE = "batch_stream.pt"


def aligned_offset(pulled: int, period: int) -> int:
    """Offset, in a window of `period` items starting after `pulled` items, of the first item of a batch."""
    return -pulled % period


class GenerationBatchStream:
    """The trainer's epoch iterator, read in whole generation batches (see the module docstring).

    Before each pull transformers makes, `enter(iterator)`; after it, `note_pulled(pulled, asked)`. `next_batch()`
    consumes one period (`steps_per_generation * num_iterations` items) and returns the generation batch that
    starts inside it, or None when the epoch has no full batch left. `epoch` is the index of the epoch being read.
    """

    def __init__(self, period: int):
        self.period = period
        self.epoch = 0
        self.consumed = 0  # items taken from the epoch's iterator (transformers', own reads, resume skip)
        self.exhausted = False  # the epoch's iterator ran out
        self._iterator: Iterator | None = None
        self._skip = 0  # items the first iterator after a resume skips
        self.held: tuple[int, int] | None = (
            None  # (epoch, consumed) before the oldest batch read but not trained
        )
        self.resumed_from: str | None = None  # the checkpoint folder of the last `resume`

    def enter(self, iterator: Iterator) -> int:
        """The iterator transformers pulls from next: a new one is the next epoch (after a resume, the saved
        epoch, whose consumed items are skipped first). Returns the number of items skipped."""
        if iterator is self._iterator:
            return 0
        if self._iterator is not None:
            self.epoch += 1
        self._iterator, self.exhausted = iterator, False
        self.consumed = sum(1 for _ in zip(range(self._skip), iterator, strict=False))
        self._skip = 0
        return self.consumed

    def pull(self, iterator: Iterator, asked: int, get_batch_samples, restore_rng) -> tuple:
        """One optimizer step's prefetch by transformers from `iterator` (`get_batch_samples()`: its batch samples and
        item count, returned), counted. When a resumed epoch's consumed items were skipped first (`enter`), the
        iterator drew from the RNG: `restore_rng(folder)` restores the state saved in the resumed checkpoint, as
        transformers does after a skip."""
        skipped = self.enter(iterator)
        batch_samples, num_items_in_batch = get_batch_samples()
        self.note_pulled(len(batch_samples), asked)
        if skipped:
            restore_rng(self.resumed_from)
        return batch_samples, num_items_in_batch

    def note_pulled(self, pulled: int, asked: int) -> None:
        self.consumed += pulled
        self.exhausted |= pulled < asked

    def next_batch(self):
        if self._iterator is None:
            return None
        offset = aligned_offset(self.consumed, self.period)
        window = list(islice(self._iterator, self.period))
        self.note_pulled(len(window), self.period)
        return window[offset] if offset < len(window) else None

    def state_dict(self, epoch_length: int | None = None) -> dict:
        """Where the stream is; `epoch_length` (items per epoch, if known) also marks a fully consumed epoch
        as run out before its iterator has said so. With batches read but not trained (`held`, asynchronous
        rollouts in flight), the position before the oldest of them: a resume generates them again."""
        if self.held is not None:
            return {"epoch": self.held[0], "consumed": self.held[1], "exhausted": False}
        exhausted = self.exhausted or (epoch_length is not None and self.consumed >= epoch_length)
        return {"epoch": self.epoch, "consumed": self.consumed, "exhausted": exhausted}

    def load_state_dict(self, state: dict) -> None:
        """Resume where `state` was saved: the saved epoch minus its consumed items, or the next epoch."""
        done = bool(state["exhausted"])
        self.epoch = int(state["epoch"]) + done
        self._skip = 0 if done else int(state["consumed"])
        self._iterator, self.consumed, self.exhausted = None, 0, False

    def resume(self, folder: str, global_step: int) -> tuple[int, int]:
        """Resume where checkpoint `folder` (of optimizer step `global_step`) saved the stream; returns transformers'
        resume position: the stream's epoch (the next one if the saved epoch had run out) and no batch to skip,
        since the stream skips the items the epoch had consumed before transformers' first pull (`pull`)."""
        self.load_state_dict(load_stream_state(folder, global_step))
        self.resumed_from = folder
        return self.epoch, 0


def load_stream_state(folder: str, global_step: int) -> dict:
    """The stream state saved in checkpoint `folder`; a clear error when it was saved without one."""
    path = os.path.join(folder, STATE_FILE)
    if not os.path.isfile(path):
        raise ValueError(
            f"Resuming at step {global_step} with dynamic_sampling, selective_rollout or max_staleness, but {folder} has no "
            f"{STATE_FILE}: a step reads more than one generation batch, so transformers' resume position would "
            "re-read or skip prompts. Fix: resume from a checkpoint saved by GRPOHubTrainer with the same "
            "settings, or set ignore_data_skip=True to restart the epoch transformers computes from its beginning."
        )
    return torch.load(path, weights_only=True)


class BatchStreamCallback(TrainerCallback):
    """Save the stream's position in every checkpoint (rank 0 writes); on resume, replay the sampler's shuffles.

    TRL's RepeatSampler draws a new permutation per pass and has no `set_epoch`: a fresh trainer resumed in
    epoch e must pass over the dataloader e times first (one item each) to shuffle as the uninterrupted run did.
    transformers then restores the RNG state at the start of the resumed epoch.
    """

    def __init__(self, stream: GenerationBatchStream):
        self.stream = stream

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        for _ in range(self.stream.epoch):
            next(iter(train_dataloader), None)

    def on_save(self, args, state, control, train_dataloader=None, **kwargs):
        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            os.makedirs(folder, exist_ok=True)
            length = len(train_dataloader) if has_length(train_dataloader) else None
            torch.save(self.stream.state_dict(length), os.path.join(folder, STATE_FILE))
