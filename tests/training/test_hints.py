"""Hint-guided rollouts (GRPOHubConfig.hint_column, grpo_hub.training.hints) in the trainer: a hint is the start of
the assistant's answer and only context; rewards score hint + completion; off, or on with no prompt hinted, is the
batch without hints bit for bit; evaluation never sees hints; lengths follow the outcomes and survive a resume; bad
input is one line."""

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_hub import GRPOHubTrainer
from grpo_hub.tasks import get_reward_funcs, load_task_dataset
from grpo_hub.tasks.chain import chain_step_reward
from grpo_hub.tasks.chain_model import chain_model_path
from grpo_hub.training.hints import HINT_COLUMN
from grpo_hub.training.input_checks import check_trainer_options
from tests.helpers import make_trainer, tiny_config

HINTS = {"hint_column": "solution", "hint_separator": ",", "hint_group_column": "level"}


def chain_trainer(tmp_path, reward_funcs=None, dataset=None, **overrides):
    """The shipped chain model on 16 chain problems, 2 prompts x 4 completions per step."""
    path = chain_model_path()
    torch.manual_seed(0)
    settings = {
        "max_completion_length": 48,
        "temperature": 1.0,
        "learning_rate": 0.0,
        "shuffle_dataset": False,
    }
    return GRPOHubTrainer(
        model=AutoModelForCausalLM.from_pretrained(path),
        reward_funcs=reward_funcs or get_reward_funcs("chain"),
        args=tiny_config(tmp_path, **{**settings, **overrides}),
        train_dataset=dataset if dataset is not None else load_task_dataset("chain", n=16, seed=0),
        processing_class=AutoTokenizer.from_pretrained(path),
    )


def scored(trainer, rows, seed=0, train=True):
    torch.manual_seed(seed)
    trainer.model.train(train)
    return trainer._generate_and_score_completions(rows)


def batch_rows(trainer):
    return [trainer.train_dataset[i] for i in (0, 1) for _ in range(trainer.num_generations)]


def test_with_no_prompt_hinted_the_batch_is_the_batch_without_hints(tmp_path):
    plain = chain_trainer(tmp_path / "plain")
    hinted = chain_trainer(tmp_path / "hinted", **HINTS)
    a, b = scored(plain, batch_rows(plain)), scored(hinted, batch_rows(hinted))
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages"):
        assert torch.equal(a[key], b[key]), key


def test_a_hinted_prompt_continues_its_hint_as_the_start_of_the_assistants_answer(tmp_path):
    seen = {}

    def spy(prompts, completions, hint, **kwargs):
        seen.update(prompts=prompts, completions=completions, hint=hint)
        return get_reward_funcs("chain")[0](prompts, completions, **kwargs)

    trainer = chain_trainer(tmp_path, reward_funcs=[spy], **HINTS)
    rows = batch_rows(trainer)
    level = rows[0]["level"]
    assert level > 1  # a one-step problem is never hinted: this test would check nothing
    trainer._hints.lengths[level] = 1
    output = scored(trainer, rows)
    tokenizer = trainer.processing_class
    steps = rows[0]["solution"].split(",")
    hint = steps[0] + ","
    rendered = tokenizer.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, return_dict=True)
    expected = list(rendered["input_ids"]) + tokenizer.encode(hint, add_special_tokens=False)
    prompt = output["prompt_ids"][0][output["prompt_mask"][0].bool()].tolist()
    assert prompt == expected  # the generation prompt, then the hint: no new message
    completion = output["completion_ids"][0][output["completion_mask"][0].bool()].tolist()
    # rewards: the prompt without its hint, the whole answer (hint + completion), the hint itself
    assert seen["prompts"][0] == rows[0]["prompt"]
    assert seen["hint"][0] == hint
    assert seen["completions"][0][0]["content"].startswith(hint)
    assert seen["completions"][0][0]["content"] == hint + tokenizer.decode(
        completion, skip_special_tokens=True
    )


def test_the_step_reward_pays_only_for_the_clauses_the_completion_wrote():
    solution = ["37+5=42,42*3=126,126-4=122"]
    whole = [[{"role": "assistant", "content": "37+5=42,42*3=126,126-4=122"}]]
    assert chain_step_reward(None, whole, solution) == [1.0]
    assert chain_step_reward(None, whole, solution, hint=["37+5=42,42*3=126,"]) == [1 / 3]
    assert chain_step_reward(None, whole, solution, hint=[""]) == [1.0]
    wrong_after_hint = [[{"role": "assistant", "content": "37+5=42,42*3=126,126-4=121"}]]
    assert chain_step_reward(None, wrong_after_hint, solution, hint=["37+5=42,42*3=126,"]) == [0.0]


def test_evaluation_never_sees_hints(tmp_path):
    plain = chain_trainer(tmp_path / "plain")
    hinted = chain_trainer(tmp_path / "hinted", **HINTS)
    rows = batch_rows(hinted)
    hinted._hints.lengths[rows[0]["level"]] = 1
    a, b = scored(plain, batch_rows(plain), train=False), scored(hinted, rows, train=False)
    assert torch.equal(a["prompt_ids"], b["prompt_ids"]) and torch.equal(
        a["completion_ids"], b["completion_ids"]
    )


def always_wrong(prompts, completions, **kwargs):
    return [0.0] * len(completions)


def test_lengths_grow_while_nothing_is_right_are_logged_and_come_back_on_resume(tmp_path):
    settings = {**HINTS, "max_steps": 4, "save_strategy": "steps", "save_steps": 2, "hint_window": 4}
    full = chain_trainer(
        tmp_path / "full", reward_funcs=[always_wrong], **{**settings, "save_strategy": "no"}
    )
    full.train()
    logs = [h for h in full.state.log_history if "hints/share_hinted" in h]
    assert logs[0]["hints/share_hinted"] == 0.0 and max(h["hints/share_hinted"] for h in logs) > 0
    assert any(key.startswith("hints/length/") for key in logs[-1]) and "hints/right_unhinted" in logs[0]
    assert full._hints.lengths and all(length > 0 for length in full._hints.lengths.values())
    cut = chain_trainer(tmp_path / "cut", reward_funcs=[always_wrong], **settings)
    cut.train()
    assert (tmp_path / "cut" / "checkpoint-2" / "hints.pt").exists()
    resumed = chain_trainer(tmp_path / "cut", reward_funcs=[always_wrong], **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "cut" / "checkpoint-2"))
    assert resumed._hints.lengths == full._hints.lengths and resumed._hints.counts == full._hints.counts


def test_text_prompts_end_with_their_hint(tmp_path, tiny_model_dir):
    dataset = Dataset.from_dict({"prompt": ["Count: ", "Count: "], "solution": ["1\n2\n3", "4\n5\n6"]})
    trainer = make_trainer(GRPOHubTrainer, tiny_model_dir, tiny_config(tmp_path, hint_column="solution"),
                           reward_funcs=[always_wrong], dataset=dataset)  # fmt: skip
    trainer._hints.lengths = {trainer._hints.key(row): 2 for row in dataset}
    rows = trainer._hints.apply([dataset[0]], progress=0.0)
    assert rows[0]["prompt"] == "Count: 1\n2\n" and rows[0][HINT_COLUMN] == "1\n2\n"
    prompts, completions = trainer._hints.for_rewards(rows, [rows[0]["prompt"]], ["3"])
    assert prompts == ["Count: "] and completions == ["1\n2\n3"]


# --- bad input: one line naming the field and the fix ---
def test_a_missing_column_or_a_separator_that_never_splits_is_refused_when_the_trainer_is_built(tmp_path):
    with pytest.raises(ValueError, match=r"`hint_column`: the training dataset has no column 'steps'.*Fix:"):
        chain_trainer(tmp_path, **{**HINTS, "hint_column": "steps"})
    with pytest.raises(
        ValueError, match=r"`hint_separator`: ';' splits none of the first 16 solutions.*Fix:"
    ):
        chain_trainer(tmp_path, **{**HINTS, "hint_separator": ";"})


def test_an_empty_solution_or_a_hint_longer_than_the_completion_budget_is_one_line(tmp_path):
    dataset = load_task_dataset("chain", n=16, seed=0)
    empty = dataset.map(lambda row, i: {"solution": "" if i == 0 else row["solution"]}, with_indices=True)
    trainer = chain_trainer(tmp_path, dataset=empty, **HINTS)
    with pytest.raises(ValueError, match=r"`hint_column`: a row's solution is empty.*Fix:"):
        trainer._hints.apply([empty[0]], progress=0.0)
    short = chain_trainer(tmp_path, **{**HINTS, "max_completion_length": 4})
    row = next(r for r in dataset if r["level"] > 1)
    short._hints.lengths[row["level"]] = 1
    with pytest.raises(ValueError, match=r"`hint_column`: the hint .* tokens.*max_completion_length=4.*Fix:"):
        short._hints.apply([row], progress=0.0)


@pytest.mark.parametrize("kind", ["multi_turn", "is_vlm"])
def test_tool_calling_rollouts_and_images_are_refused_naming_hint_column(tmp_path, kind):
    """tools / environment_factory / rollout_func (multi_turn) and vision-language models, at trainer build."""
    options = {"multi_turn": False, "is_vlm": False, kind: True}
    with pytest.raises(ValueError, match=r"`hint_column`: .*turn by turn.*Fix: set hint_column=None"):
        check_trainer_options(tiny_config(tmp_path, **HINTS), has_reference=False, datasets={}, **options)


RANK_RUNS = {
    "ddp": ("cpu-ddp.yaml", "MULTI_CPU", []),
    "zero2": ("cpu-zero2.yaml", "DEEPSPEED", ["--lora"]),
    "zero3": ("cpu-zero3.yaml", "DEEPSPEED", ["--lora"]),
}


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "ddp",
        pytest.param("zero2", marks=pytest.mark.deepspeed),
        pytest.param("zero3", marks=pytest.mark.deepspeed),
    ],
)
def test_two_ranks_hint_alike_and_train_the_same_weights(name):
    """2 ranks, groups spanning both: every rank keeps the same hint lengths after every step, hints the rows of a
    group alike (each rank's reward function sees them), and the weights stay equal."""
    from pathlib import Path

    from tests.training.distributed.checks import assert_two_rank_world
    from tests.training.distributed.launch import run_accelerate

    config, kind, extra = RANK_RUNS[name]
    worker = str(Path(__file__).parent / "distributed" / "hints_worker.py")
    result = run_accelerate(config, worker, ["--max-steps", "6", *extra])
    assert_two_rank_world(result, kind)
    first, second = result["ranks"]
    assert first["lengths"] == second["lengths"] and len(first["lengths"]) == 6
    assert first["lengths"][-1]["hard"] > 0 and first["lengths"][-1]["easy"] == 0  # hard grew, easy never
    hinted = [h for rows in first["hints_seen"] + second["hints_seen"] for h in rows if h]
    assert hinted, "no row was hinted: the test checks nothing"
    for rows0, rows1 in zip(first["hints_seen"], second["hints_seen"], strict=True):
        together = rows0 + rows1
        assert all(
            len(set(together[i : i + 4])) == 1 for i in range(0, len(together), 4)
        )  # a group: one hint
    assert first["param_fingerprint"] == second["param_fingerprint"], "the ranks' weights diverged"


def test_a_hinted_batch_packs_exactly_with_padding_free_and_shared_prompts(tmp_path):
    """A hinted prompt is a prompt: the packed and shared-prompt forwards of a hinted batch give TRL's padded
    log-probs (to fp32 rounding), its rows grouped by their hinted prompt."""
    trainers = {
        name: chain_trainer(tmp_path / name, **HINTS, **settings)
        for name, settings in {
            "padded": {},
            "packed": {"padding_free": True},
            "shared": {"padding_free": True, "shared_prompts": True},
        }.items()
    }
    rows = batch_rows(trainers["padded"])
    for trainer in trainers.values():
        trainer._hints.lengths[rows[0]["level"]] = 1
    output = scored(trainers["padded"], rows)
    assert trainers["padded"]._metrics["train"]["hints/share_hinted"][-1] > 0, "no row was hinted"
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    keep = output["completion_ids"].shape[1]
    logps = {
        name: trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)[0].detach()
        for name, trainer in trainers.items()
    }
    real = output["completion_mask"].bool()
    for name in ("packed", "shared"):
        torch.testing.assert_close(logps[name][real], logps["padded"][real], rtol=0, atol=1e-4)


def test_an_iterable_dataset_is_checked_for_its_column_and_its_rows_as_they_come():
    from grpo_hub.training.hints import check_dataset

    rows = Dataset.from_dict({"prompt": ["a"], "solution": ["1,2"]}).to_iterable_dataset()
    check_dataset(rows, "solution", ",")  # no select(): the separator is checked row by row
    with pytest.raises(ValueError, match=r"`hint_column`: the training dataset has no column 'steps'"):
        check_dataset(rows, "steps", ",")
