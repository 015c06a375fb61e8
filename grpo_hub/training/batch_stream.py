"""The trainer's epoch iterator read in whole generation batches, for dynamic sampling and selective rollout.

TRL's train dataloader yields one *generation batch* per micro-step, each repeated
`steps_per_generation * num_iterations` times in a row (RepeatSampler), and transformers pulls one optimizer
step's worth of items from the epoch iterator before the step (`Trainer.get_batch_samples`).
`GenerationBatchStream` is told every pull from that same iterator and takes the NEXT generation batch from it,
consuming exactly one period of items so TRL's generation micro-steps stay aligned with the first item of a
batch.
"""

from __future__ import annotations

from collections.abc import Iterator


def aligned_offset(pulled: int, period: int) -> int:
    """Offset, in a window of `period` items starting after `pulled` items, of the first item of a batch."""
    return -pulled % period


class GenerationBatchStream:
    """The trainer's epoch iterator, read in whole generation batches (see the module docstring).

    `note_pulled(iterator, n)` is called for every pull transformers makes; `next_batch()` consumes one period
    (`steps_per_generation * num_iterations` items) and returns the generation batch that starts inside it,
    or None when the epoch has no full batch left. `state_dict()` holds the items `next_batch` read in this
    epoch; after `load_state_dict`, `skip_resumed(iterator)` (called before transformers' first pull of the
    resumed epoch) skips them, since transformers' resume skips only its own steps' items.
    """

    def __init__(self, period: int):
        self.period = period
        self._iterator: Iterator | None = None
        self._pulled = 0
        self._read = 0  # items next_batch consumed from the current iterator
        self._skip_on_resume = 0

    def note_pulled(self, iterator: Iterator, count: int) -> None:
        if iterator is not self._iterator:  # a new epoch (or a resumed one)
            self._iterator, self._pulled, self._read = iterator, 0, 0
        self._pulled += count

    def skip_resumed(self, iterator: Iterator) -> None:
        if not self._skip_on_resume or iterator is self._iterator:
            return
        skipped = sum(1 for _ in zip(range(self._skip_on_resume), iterator, strict=False))
        self._iterator, self._pulled, self._read, self._skip_on_resume = iterator, skipped, skipped, 0

    def next_batch(self):
        if self._iterator is None:
            return None
        offset = aligned_offset(self._pulled, self.period)
        window = []
        for _ in range(self.period):
            try:
                window.append(next(self._iterator))
            except StopIteration:
                break
        self._pulled += len(window)
        self._read += len(window)
        return window[offset] if offset < len(window) else None

    def state_dict(self) -> dict:
        return {"read": self._read}

    def load_state_dict(self, state: dict) -> None:
        self._skip_on_resume = int(state["read"])
