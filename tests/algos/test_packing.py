"""Packing plan of filtered rows (grpo_hub.algos.packing): against a step-by-step naive reference."""

import math
import random

import torch

from grpo_hub.algos.packing import concat_micro_batches, cycle_segments, packed_rows, packing_plan


def naive_plan(rows, num_iterations, accumulation_steps, window_position, batch_size):
    """Walk the cycle micro-step by micro-step; flush the pending slots at a buffer end or an optimizer step end."""
    steps = len(rows[0])
    plan, pending = [], []
    for position in range(steps * num_iterations):
        pending.append(position)
        ends_window = (window_position + position + 1) % accumulation_steps == 0
        if position % steps == steps - 1 or ends_window:
            slots = [p % steps for p in pending]
            most = max(sum(rank[s] for s in slots) for rank in rows)
            k = math.ceil(max(most, 1) / batch_size)
            width = max(math.ceil(most / k), 1)
            plan += [None] * (len(pending) - k)
            plan += [(range(slots[0], slots[-1] + 1), chunk, k, width) for chunk in range(k)]
            pending = []
    return plan


def test_plan_matches_naive_reference_on_random_inputs():
    rng = random.Random(0)
    for _ in range(500):
        steps, batch_size = rng.randint(1, 6), rng.randint(1, 5)
        num_iterations, accumulation = rng.randint(1, 3), rng.randint(1, 8)
        window_position = rng.randrange(accumulation)
        ranks = rng.randint(1, 3)
        rows = [
            [rng.choice([0, batch_size, rng.randint(0, batch_size)]) for _ in range(steps)]
            for _ in range(ranks)
        ]
        plan = packing_plan(torch.tensor(rows), num_iterations, accumulation, window_position, batch_size)
        assert plan == naive_plan(rows, num_iterations, accumulation, window_position, batch_size)
        assert len(plan) == steps * num_iterations
        for position, entry in enumerate(plan):
            if (window_position + position + 1) % accumulation == 0 or position == len(plan) - 1:
                assert entry is not None, "the micro-step that ends an optimizer step must run"
            if entry is not None:  # every rank's chunk fits the agreed row count, which fits the batch size
                slots, chunk, k, num_rows = entry
                assert 1 <= num_rows <= batch_size
                for rank in rows:
                    assert len(packed_rows(sum(rank[s] for s in slots), chunk, k)) <= num_rows


def test_plan_edge_cases():
    # half the rows of 4 full micro-steps: 2 run, at the end of the optimizer step
    assert packing_plan(torch.tensor([[2, 2, 2, 2]]), 1, 4, 0, 4) == [
        None,
        None,
        (range(0, 4), 0, 2, 4),
        (range(0, 4), 1, 2, 4),
    ]
    # all filtered: one micro-step (the last) still runs, with a pad row
    assert packing_plan(torch.tensor([[0, 0, 0], [0, 0, 0]]), 1, 3, 0, 8) == [
        None,
        None,
        (range(0, 3), 0, 1, 1),
    ]
    # one rank with zero kept rows follows the other rank's count and pads to its row count
    assert packing_plan(torch.tensor([[0, 0], [3, 3]]), 1, 2, 0, 4) == [
        (range(0, 2), 0, 2, 3),
        (range(0, 2), 1, 2, 3),
    ]
    # nothing dropped: every micro-step runs, one slot each
    assert packing_plan(torch.tensor([[4, 4]]), 1, 2, 0, 4) == [
        (range(0, 2), 0, 2, 4),
        (range(0, 2), 1, 2, 4),
    ]
    assert packed_rows(5, 0, 2).tolist() == [0, 1, 2] and packed_rows(5, 1, 2).tolist() == [3, 4]
    assert packed_rows(0, 0, 1).numel() == 0


def test_segments_follow_buffer_passes_and_optimizer_steps():
    # steps_per_generation 4, 2 iterations, accumulation 3: cut at optimizer-step ends 2, 5 and buffer ends 3, 7
    assert cycle_segments(4, 2, 3, 0) == [range(0, 3), range(3, 4), range(4, 6), range(6, 8)]
    # accumulation 4 spans two generation batches of 2: the optimizer step already ran 2 micro-steps
    assert cycle_segments(2, 1, 4, 2) == [range(0, 2)]


def test_concat_keeps_scalars_and_joins_rows():
    a = {"prompt_ids": torch.zeros(2, 3), "advantages": torch.ones(2), "rows_per_step": torch.tensor(4.0)}
    b = {"prompt_ids": torch.ones(1, 3), "advantages": torch.zeros(1), "rows_per_step": torch.tensor(4.0)}
    out = concat_micro_batches([a, b])
    assert out["prompt_ids"].shape == (3, 3) and out["advantages"].tolist() == [1.0, 1.0, 0.0]
    assert out["rows_per_step"] is a["rows_per_step"]
