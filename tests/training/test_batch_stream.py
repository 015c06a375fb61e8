"""GenerationBatchStream without a model: every generation batch used once, the epoch running out, resume."""

from itertools import islice

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_hub.training.batch_stream import GenerationBatchStream


def simulate(period: int, grad_accum: int, refills: list[int], n_batches: int) -> list[int]:
    """Transformers + TRL reading a RepeatSampler stream, with `refills[k]` extra batches at generation k.

    Items are (batch id, repeat index); TRL generates on micro-steps that are multiples of `period` from the
    item it was handed, and every batch it or the stream generates must start a batch (repeat index 0).
    """
    items = iter([(b, r) for b in range(n_batches) for r in range(period)])
    stream, generated, micro_step = GenerationBatchStream(period), [], 0
    while True:
        stream.enter(items)
        pulled = list(islice(items, grad_accum))
        stream.note_pulled(len(pulled), grad_accum)
        if not pulled:
            return generated
        for batch, repeat in pulled:
            if micro_step % period == 0:
                assert repeat == 0, "TRL would generate from a repeat of an already used batch"
                generated.append(batch)
                for _ in range(refills[len(generated) % len(refills)]):
                    extra = stream.next_batch()
                    if extra is None:
                        break
                    assert extra[1] == 0
                    generated.append(extra[0])
            micro_step += 1


@settings(max_examples=60, deadline=None)
@given(
    spg=st.integers(1, 4),
    iterations=st.integers(1, 2),
    accum_factor=st.sampled_from([(1, 1), (2, 1), (1, 2), (3, 1)]),
    refills=st.lists(st.integers(0, 3), min_size=1, max_size=4),
)
def test_stream_uses_every_generation_batch_exactly_once(spg, iterations, accum_factor, refills):
    """No prompt lost or repeated: each batch of the epoch is generated once, by TRL or by a refill round."""
    period = spg * iterations
    grad_accum = spg * accum_factor[0] // accum_factor[1] if spg % accum_factor[1] == 0 else spg
    generated = simulate(period, grad_accum, refills, n_batches=12)
    assert sorted(generated) == list(range(12))


def test_stream_returns_none_when_the_epoch_is_exhausted():
    stream = GenerationBatchStream(period=2)
    assert stream.next_batch() is None  # no epoch iterator seen yet
    items = iter([("a", 0), ("a", 1), ("b", 0), ("b", 1)])
    stream.enter(items)
    assert stream.next_batch() == ("a", 0)
    assert stream.next_batch() == ("b", 0)
    assert stream.next_batch() is None
    assert stream.exhausted


def run(stream, period: int, grad_accum: int, n_batches: int, epochs: int, saves: list) -> list[list]:
    """transformers' epoch loop from the stream's epoch: one iterator per epoch, `grad_accum` items pulled per
    optimizer step, TRL generating every `period` micro-steps, each generation followed by `(3 * batch + epoch)
    % 4` refill reads from the stream. Returns the (epoch, batch) generated per step; `saves` gets the stream's
    state after each step. Like transformers, training stops at an epoch without a single item."""
    steps, micro_step, length = [], 0, n_batches * period
    for epoch in range(stream.epoch, epochs):
        items = iter([(epoch, b, r) for b in range(n_batches) for r in range(period)])
        pulled_any = False
        while True:
            stream.enter(items)
            pulled = list(islice(items, grad_accum))
            stream.note_pulled(len(pulled), grad_accum)
            if not pulled:
                break
            pulled_any, step = True, []
            for e, batch, repeat in pulled:
                if micro_step % period == 0:
                    assert repeat == 0, "TRL would generate from a repeat of an already used batch"
                    step.append((e, batch))
                    for _ in range((3 * batch + epoch) % 4):
                        extra = stream.next_batch()
                        if extra is None:
                            break
                        step.append(extra[:2])
                micro_step += 1
            steps.append(step)
            saves.append((stream.state_dict(length), stream.state_dict()))
        if not pulled_any:
            return steps
    return steps


@pytest.mark.parametrize(("period", "grad_accum", "n_batches"), [(1, 1, 7), (2, 2, 6), (2, 4, 9), (3, 3, 5)])
def test_a_stream_resumed_from_any_saved_state_continues_as_the_uninterrupted_one(
    period, grad_accum, n_batches
):
    saves: list = []
    full = run(GenerationBatchStream(period), period, grad_accum, n_batches, epochs=3, saves=saves)
    assert sorted(batch for step in full for batch in step) == [
        (e, b) for e in range(3) for b in range(n_batches)
    ]
    for k, (state, _) in enumerate(saves):
        resumed = GenerationBatchStream(period)
        resumed.load_state_dict(state)
        assert run(resumed, period, grad_accum, n_batches, epochs=3, saves=[]) == full[k + 1 :], k


def test_the_saved_state_marks_an_epoch_consumed_to_its_last_item_as_run_out():
    saves: list = []
    run(GenerationBatchStream(1), 1, 1, 7, epochs=3, saves=saves)
    epoch_ends = [(by_length, by_iterator) for by_length, by_iterator in saves if by_length["exhausted"]]
    assert any(not by_iterator["exhausted"] for _, by_iterator in epoch_ends)  # the iterator had not said so
    assert all(by_length["consumed"] == 7 for by_length, _ in epoch_ends)
