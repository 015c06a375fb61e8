"""SelectiveRollout without a model: stable ids, replacement from the stream, carry-over, the epoch running out."""

import collections

import torch

from grpo_hub.algos.advantages import ALL_MIN
from grpo_hub.training.dynamic_sampling import GenerationBatchStream
from grpo_hub.training.selective_rollout import SelectiveRollout, prompt_id, shrunk_group_count

GROUP = 2


def make_selector(
    batches: list[list[dict]],
    min_keep: float = 1e-9,
    revisit_after: int | None = None,
    mode: str = "replace",
    row_multiple: int = 1,
    gather_objects=lambda rows: rows,
    rank: int = 0,
) -> SelectiveRollout:
    """A selector whose stream yields `batches` (period 1) after the batch handed to `select` (one rank unless
    `gather_objects` concatenates more)."""
    stream = GenerationBatchStream(period=1)
    stream.enter(iter(batches))
    stream.note_pulled(1, 1)  # the batch handed to `select`
    return SelectiveRollout(
        stream=stream, gather_objects=gather_objects, gather=lambda t: t, rank=rank, group_size=GROUP,
        id_column="index", mode=mode, row_multiple=row_multiple, explore_init=0.05, target=0.25, step=0.0, min_keep=min_keep,
        revisit_after=revisit_after, eps=0.0,
        reward_min=0.0, reward_max=1.0, seed=0, metrics=collections.defaultdict(list),
    )  # fmt: skip


def rows(*indices: int) -> list[dict]:
    return [{"prompt": f"p{i}", "index": i} for i in indices for _ in range(GROUP)]


def learn_hard(selector: SelectiveRollout, indices, times: int = 3) -> None:
    """Record `indices` as all-min `times` times (P_skip = 1 - 0.05**3 for each)."""
    for _ in range(times):
        selector.history.record([prompt_id({"index": i}, "index") for i in indices], [ALL_MIN] * len(indices))


def indices(selected: list[dict]) -> list[int]:
    return [row["index"] for row in selected[::GROUP]]


def test_prompt_ids_are_stable_and_key_messages_too():
    chat = [{"role": "user", "content": "hi"}]
    assert prompt_id({"prompt": chat}, None) == prompt_id({"prompt": [dict(reversed(chat[0].items()))]}, None)
    assert prompt_id({"prompt": "a"}, None) != prompt_id({"prompt": "b"}, None)
    assert prompt_id({"index": 3, "prompt": "x"}, "index") == prompt_id({"index": 3, "prompt": "y"}, "index")


def test_skipped_groups_are_replaced_by_the_next_ones_and_leftovers_come_first_next_time():
    selector = make_selector([rows(2, 3), rows(4, 5)])
    learn_hard(selector, [0])
    torch.manual_seed(0)
    first = selector.select(rows(0, 1))
    assert len(first) == 2 * GROUP and indices(first) == [1, 2]  # 0 skipped, 2 read from the next batch
    assert selector.metrics["selective_rollout/skipped_all_min"] == [1.0]
    assert selector.metrics["selective_rollout/rows_saved"] == [float(GROUP)]
    assert indices(selector.select(rows(6, 7))) == [3, 6]  # 3 was left over


def test_when_the_epoch_runs_out_skipped_groups_fill_the_batch():
    selector = make_selector([])
    learn_hard(selector, [0, 1])
    selected = selector.select(rows(0, 1))
    assert indices(selected) == [0, 1]
    assert selector.metrics["selective_rollout/data_exhausted"] == [1.0]
    assert selector.metrics["selective_rollout/rows_saved"] == [0.0]


def test_revisits_of_skipped_prompts_measure_the_filter_error():
    selector = make_selector([rows(2, 3)])
    learn_hard(selector, [0])
    selector.select(rows(0, 1))  # 0 is skipped, 1 and 2 are generated, 3 is left over
    selector.record(torch.tensor([0.0, 1.0, 0.5, 0.5]))
    assert "selective_rollout/revisit_informative_frac" not in selector.metrics
    selector.min_keep = 1.0  # P_skip = 0: prompt 0 comes back
    assert indices(selector.select(rows(0, 4))) == [3, 0]
    selector.record(torch.tensor([1.0, 1.0, 0.0, 1.0]))  # 0 turned out informative: the filter erred
    assert selector.metrics["selective_rollout/revisit_informative_frac"] == [1.0]


def test_a_prompt_skipped_revisit_after_times_its_streak_is_generated_at_its_next_visit():
    selector = make_selector([rows(i + 10, i + 20) for i in range(20)], revisit_after=1)
    learn_hard(selector, [0], times=2)  # streak z = 2, P_skip = 1 - 0.05**2: skipped at almost every visit
    visits = [0 in indices(selector.select(rows(0, 1))) for _ in range(3)]
    assert visits == [False, False, True]  # skipped z = 2 times, then generated whatever the draw
    unbounded = make_selector([rows(i + 10, i + 20) for i in range(20)])
    learn_hard(unbounded, [0], times=2)
    assert not any(0 in indices(unbounded.select(rows(0, 1))) for _ in range(3))  # GRESO's rule alone


def test_exploration_adapts_once_per_step_on_pooled_fractions_from_the_second_epoch():
    """GRESO's cadence (ray_trainer.py: once per training step, `if epoch > 0`), against a hand computation."""
    from grpo_hub.algos.advantages import ALL_MAX

    selector = make_selector([rows(2, 3), rows(4, 5)])
    selector.step, selector.explore = 0.01, {ALL_MAX: 0.5, ALL_MIN: 0.5}
    selector.select(rows(0, 1))
    selector.record(torch.tensor([0.0, 0.0, 0.0, 0.0]))  # two all-min groups
    selector.end_step()
    assert selector.explore == {ALL_MAX: 0.5, ALL_MIN: 0.5}  # first epoch: no adaptation
    selector.stream.epoch = 1
    for rewards in ([1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]):  # two rounds of one step, pooled
        selector.select(rows(6, 7))
        selector.record(torch.tensor(rewards))
    assert selector.explore == {ALL_MAX: 0.5, ALL_MIN: 0.5}  # nothing moves before the step ends
    selector.end_step()  # pooled: all-max 1/4 >= 1/12 -> down; all-min 1/4 >= 1/6 -> down
    assert selector.explore == {ALL_MAX: 0.49, ALL_MIN: 0.49}
    selector.end_step()  # a step without scorings changes nothing
    assert selector.explore == {ALL_MAX: 0.49, ALL_MIN: 0.49}


def naive_shrunk_count(kept: int, total: int, group_size: int, row_multiple: int) -> int:
    return next(
        g for g in range(max(kept, 1), total + 1) if (g * group_size) % row_multiple == 0 or g == total
    )


def test_shrunk_group_count_is_the_smallest_even_split_at_least_the_kept_groups():
    for group_size in (1, 2, 3, 4, 8):
        for row_multiple in (1, 2, 3, 4, 6, 8):
            for total in range(1, 13):
                if (total * group_size) % row_multiple:
                    continue  # TRL's batch splits evenly over ranks and micro-steps
                for kept in range(total + 1):
                    expected = naive_shrunk_count(kept, total, group_size, row_multiple)
                    assert shrunk_group_count(kept, total, group_size, row_multiple) == expected


def test_shrink_generates_only_the_kept_groups_and_reads_nothing_more():
    selector = make_selector([rows(4, 5)], mode="shrink")
    learn_hard(selector, [0, 2])
    selected = selector.select(rows(0, 1, 2, 3))
    assert indices(selected) == [1, 3]  # 0 and 2 dropped, not replaced
    assert selector.metrics["selective_rollout/batches_read"] == [0.0]
    assert selector.metrics["selective_rollout/groups_generated"] == [2.0]
    assert selector.metrics["selective_rollout/rows_saved"] == [2.0 * GROUP]
    assert selector.stream.next_batch() == rows(4, 5)  # the next batch is still the next step's
    selector.record(torch.tensor([0.0, 1.0, 1.0, 0.0]))  # the history takes the kept groups' rewards
    learn_hard(selector, [0, 1, 2, 3], times=3)
    assert indices(selector.select(rows(0, 1, 2, 3))) == [0]  # all skipped: the first one is still generated


def test_shrink_tops_up_with_skipped_groups_to_what_the_ranks_split_evenly():
    """Two ranks holding 2 groups each (a group spans both ranks' rows when GROUP=2 and 2 rows per rank); one
    group kept -> 2 groups generated (4 rows, 2 per rank), the first skipped one in order topping it up."""
    batch = rows(0, 1, 2, 3)
    ranks = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
    selected = []
    for rank in (0, 1):
        selector = make_selector([], mode="shrink", row_multiple=4, gather_objects=lambda _: batch, rank=rank)
        learn_hard(selector, [0, 1, 3])
        selected.append(selector.select(ranks[rank]))
        assert selector.metrics["selective_rollout/groups_generated"] == [2.0]
    assert [len(s) for s in selected] == [GROUP, GROUP]
    assert indices(selected[0] + selected[1]) == [2, 0]  # the kept group, then the first skipped one
