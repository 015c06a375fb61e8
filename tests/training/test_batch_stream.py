"""GenerationBatchStream without a model: every generation batch used once, the epoch running out, resume."""

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
        pulled = [item for _, item in zip(range(grad_accum), items, strict=False)]
        if not pulled:
            return generated
        stream.note_pulled(items, len(pulled))
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
    stream.note_pulled(items, 0)
    assert stream.next_batch() == ("a", 0)
    assert stream.next_batch() == ("b", 0)
    assert stream.next_batch() is None


def test_the_stream_skips_what_it_had_read_when_resumed():
    stream = GenerationBatchStream(period=2)
    items = iter(range(10))
    pulled = [next(items), next(items)]  # transformers' prefetch of one step
    stream.note_pulled(items, len(pulled))
    assert stream.next_batch() == 2
    resumed = GenerationBatchStream(period=2)
    resumed.load_state_dict(stream.state_dict())
    transformers_resumed = iter(range(2, 10))  # transformers skipped its own 2 items, not the stream's
    resumed.skip_resumed(transformers_resumed)
    assert next(transformers_resumed) == 4
