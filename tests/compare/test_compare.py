"""Function-level tests of grpo_hub.compare on the offline tiny model (no gradio needed)."""

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_hub import compare as C
from grpo_hub.compare import scoring
from grpo_hub.tasks import SCORED_TASKS, get_reward_funcs
from grpo_hub.tasks.arithmetic import chat_text  # the chain task's chat template is arithmetic's

PROMPT = C.example_prompts()[0]
REWARDS = sorted(C.reward_functions())
SAMPLING = C.Sampling(temperature=1.0, top_p=1.0, max_new_tokens=12, seed=3, n=3)


def completions(columns):
    """Completions of every column, in column order."""
    return [column.completions for column in columns]


def test_same_seed_reproduces_every_column_and_another_seed_changes_them(tiny_model_dir, random_adapter):
    bank = C.load_bank(tiny_model_dir, (random_adapter,))
    first = C.compare(bank, PROMPT, SAMPLING, REWARDS)
    again = C.compare(bank, PROMPT, SAMPLING, REWARDS)
    other_seed = C.compare(bank, PROMPT, C.Sampling(max_new_tokens=12, seed=4, n=3), REWARDS)
    assert [c.label for c in first] == ["base", random_adapter]
    assert all(len(c) == 3 and all(c) for c in completions(first))
    assert completions(first) == completions(again)
    assert completions(first)[0] != completions(other_seed)[0]


def test_nonzero_adapter_changes_its_column_and_zero_adapter_does_not(
    tiny_model_dir, random_adapter, zero_adapter
):
    bank = C.load_bank(tiny_model_dir, (random_adapter, zero_adapter))
    base, random_column, zero_column = completions(C.compare(bank, PROMPT, SAMPLING, REWARDS))
    assert zero_column == base  # same seed + identity adapter: every difference comes from the adapter
    assert random_column != base


def test_trained_adapter_is_nonzero_and_changes_completions(tiny_model_dir, trained_adapter):
    from safetensors.torch import load_file

    weights = load_file(f"{trained_adapter}/adapter_model.safetensors")
    assert max(float(w.abs().max()) for k, w in weights.items() if "lora_B" in k) > 0
    bank = C.load_bank(tiny_model_dir, (trained_adapter,))
    base, trained = completions(C.compare(bank, PROMPT, C.Sampling(max_new_tokens=16, n=4), REWARDS))
    assert trained != base


def test_bank_is_loaded_once_per_configuration(tiny_model_dir, random_adapter):
    first = C.load_bank(tiny_model_dir, (random_adapter,))
    assert C.load_bank(tiny_model_dir, (random_adapter,)) is first
    assert C.load_bank(tiny_model_dir, ()) is not first


def column_reward():
    """(name, task, function) of a built-in reward that reads a dataset column besides the completions, from
    the task's own prompt rows (a scored task's rows are its held-out problems: tested below)."""
    found = [
        (name, task, fn)
        for name, (task, fn) in C.reward_functions().items()
        if scoring._needed_columns(fn) and task not in SCORED_TASKS
    ]
    if not found:
        pytest.skip("no built-in reward reads a dataset column")
    return found[0]


def test_rewards_are_scored_per_completion():
    scores = C.score(["digit_fraction_reward"], "Write only digits: 4", ["1234", "12 ab", "", "x"])
    assert scores["digit_fraction_reward"] == [1.0, 0.5, 0.0, 0.0]


def test_reward_reading_a_column_gets_it_from_the_task_row():
    name, task, fn = column_reward()
    texts = ["1234", "ab cd", "a1"]
    for prompt, row in C.task_rows(task).items():
        columns = {column: [row[column]] * len(texts) for column in scoring._needed_columns(fn)}
        assert C.score([name], prompt, texts)[name] == fn([prompt] * 3, texts, **columns)
    assert len({tuple(C.score([name], p, texts)[name]) for p in C.task_rows(task)}) > 1  # the column matters


def test_reward_reading_a_column_is_missing_for_free_prompts():
    name, _, _ = column_reward()
    scores = C.score([name, "digit_fraction_reward"], "Tell me a story", ["kk 12", "abc"])
    assert scores[name] is None
    assert scores["digit_fraction_reward"] == [pytest.approx(0.5), 0.0]
    column = C.Column("base", ["kk 12", "abc"], scores)
    assert column.mean_reward(name) is None
    assert column.mean_reward("digit_fraction_reward") == pytest.approx(0.25)


def test_compare_scores_each_generated_completion(tiny_model_dir, random_adapter):
    bank = C.load_bank(tiny_model_dir, (random_adapter,))
    for column in C.compare(bank, PROMPT, SAMPLING, REWARDS):
        assert column.rewards == C.score(REWARDS, PROMPT, column.completions)
        assert len(column.rewards["digit_fraction_reward"]) == SAMPLING.n


def test_task_rows_cover_every_prompt_of_rewards_reading_a_column():
    from grpo_hub.tasks import load_task_dataset

    _, task, _ = column_reward()
    assert set(load_task_dataset(task, n=200, seed=123)["prompt"]) <= set(C.task_rows(task))


def test_examples_start_with_one_held_out_prompt_per_level_chain_first():
    from grpo_hub.tasks import chain

    examples = C.example_prompts()
    assert examples[0] == chat_text(chain.heldout_problems()[0].question)
    for start, task in ((0, "chain"), (4, "arithmetic")):
        assert [C.task_rows(task)[prompt]["level"] for prompt in examples[start : start + 4]] == [1, 2, 3, 4]
    assert "Write only digits" in examples[8]  # then the other offline tasks


def test_examples_are_labelled_by_task_level_and_question_not_the_chat_template():
    from grpo_hub.tasks import arithmetic, chain

    examples = C.example_prompts()
    labels = [scoring.example_label(prompt) for prompt in examples]
    chain_first = [p for p in chain.heldout_problems() if p.level == 2][0]
    assert labels[1] == f"chain level 2: {chain_first.question}"
    arithmetic_first = [p for p in arithmetic.heldout_problems() if p.level == 4][0]
    assert labels[7] == f"arithmetic level 4: {arithmetic_first.question}"
    assert all("<|" not in label for label in labels)
    assert labels[8] == examples[8]  # a plain-text prompt is its own label


@pytest.mark.parametrize("task", ["chain", "arithmetic"])
def test_held_out_prompts_are_marked_right_or_wrong(task):
    reward = get_reward_funcs(task)[0]  # the correctness reward
    problem = SCORED_TASKS[task].heldout_problems()[-1]
    prompt = chat_text(problem.question)
    answers = [problem.answer, f"it is {problem.answer}", str(int(problem.answer) + 1), ""]
    assert scoring.correctness(prompt, answers) == [True, True, False, False]
    assert scoring.correctness("Write only digits: 4", ["4"]) is None
    assert C.score([reward.__name__], prompt, answers)[reward.__name__] == [1.0, 1.0, 0.0, 0.0]


def test_a_chain_scratchpad_is_right_by_its_last_result():
    from grpo_hub.tasks import chain

    problem = next(p for p in chain.heldout_problems() if p.level == 4)  # "37+5*3-4-1=" -> "37+5=42,...,121"
    wrong_end = f"{problem.solution.rsplit('=', 1)[0]}={int(problem.answer) + 1}"
    prompt = chat_text(problem.question)
    assert scoring.correctness(prompt, [problem.solution, wrong_end]) == [True, False]
    assert C.score(["arithmetic_correctness_reward"], prompt, [problem.solution]) == {
        "arithmetic_correctness_reward": None  # a reward reads the rows of its own task only
    }


def test_diff_marks_changed_words():
    segments = C.diff_segments("the cat sat", "the dog sat")
    assert ("cat", "-") in segments and ("dog", "+") in segments
    assert segments[0] == ("the ", None) and segments[-1] == (" sat", None)


@settings(max_examples=60, deadline=None)  # no wall-clock deadline on a shared machine
@given(st.text(max_size=40), st.text(max_size=40))
def test_diff_rebuilds_both_texts(base, other):
    segments = C.diff_segments(base, other)
    assert "".join(text for text, label in segments if label != "+") == base
    assert "".join(text for text, label in segments if label != "-") == other


def test_column_html_escapes_and_highlights():
    base = C.Column("base", ["<b>x</b> y"], {"digit_fraction_reward": [0.0]})
    other = C.Column("me/adapter@v1", ["<b>x</b> 7"], {"digit_fraction_reward": [1 / 6]})
    other.diffs = [C.diff_segments(base.completions[0], other.completions[0])]
    page = C.column_html(other, base=base, show_diff=True)
    assert "<b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "<del>y</del><ins>7</ins>" in page
    assert "mean digit_fraction_reward: 0.167" in page and "digit_fraction_reward=0.167" in page
    assert "(+0.167 vs base)" in page
    plain = C.column_html(other, base=base)  # the default: the adapter's own text, no diff marks
    assert "<ins>" not in plain and "<del>" not in plain and "&lt;b&gt;x&lt;/b&gt; 7" in plain


def test_column_html_hides_rewards_that_do_not_apply_and_shows_provenance():
    sha = "0123456789abcdef" * 2 + "01234567"
    column = C.Column(
        "me/adapter@v1",
        ["7"],
        {"digit_fraction_reward": [1.0], "letter_fraction_reward": None},
        provenance={
            "commit": sha,
            "url": f"https://hub/me/adapter/commit/{sha}",
            "step": 30,
            "variant": "dapo",
        },
    )
    page = C.column_html(column)
    assert "letter_fraction_reward" not in page and "n/a" not in page
    assert f'href="https://hub/me/adapter/commit/{sha}"' in page and ">0123456<" in page
    assert 'step <span class="step">30</span>' in page and ">dapo<" in page


def test_discover_adapters_keeps_trained_results_of_the_base(
    tmp_path, tiny_model_dir, random_adapter, foreign_adapter
):
    import shutil

    for name in ("run-a", "run-a/checkpoint-2", "run-a/ref", "run-b"):
        shutil.copytree(random_adapter, tmp_path / name)
    shutil.copytree(foreign_adapter, tmp_path / "run-other-base")
    (tmp_path / "not-an-adapter").mkdir()
    found = C.discover_adapters(tmp_path, tiny_model_dir)
    assert sorted(found) == [str(tmp_path / "run-a"), str(tmp_path / "run-b")]
    assert C.discover_adapters(tmp_path, "someone/another-model") == (str(tmp_path / "run-other-base"),)
    assert C.discover_adapters(tmp_path / "missing", tiny_model_dir) == ()


@pytest.mark.parametrize(
    ("text", "match"),
    [("a, b, c, d, e", "at most 4"), ("a, b, a", "listed twice")],
)
def test_bad_adapter_lists_are_rejected(text, match):
    with pytest.raises(C.CompareError, match=match):
        C.parse_adapter_specs(text)


def test_adapter_specs_split_on_commas_and_newlines():
    assert C.parse_adapter_specs(" me/a@v1,\n./b ,") == ("me/a@v1", "./b")


def test_unknown_local_adapter_is_named(tmp_path):
    with pytest.raises(C.CompareError, match="not found: no such folder"):
        C.resolve_adapter(str(tmp_path / "nope"))
    with pytest.raises(C.CompareError, match="holds no adapter_config.json"):
        C.resolve_adapter(str(tmp_path))


def test_base_mismatch_names_both_models(tiny_model_dir, foreign_adapter):
    with pytest.raises(C.CompareError, match="trained on base 'someone/another-model'") as error:
        C.ModelBank(tiny_model_dir, (foreign_adapter,))
    assert tiny_model_dir in str(error.value)


def test_base_match_is_by_model_name(tiny_model_dir, random_adapter):
    name = Path(tiny_model_dir).name
    C.check_base_match(random_adapter, f"/elsewhere/{name}", "a")  # a copy of the base in another folder
    C.check_base_match(random_adapter, f"someone/{name}", "a")  # the same model under a Hub id
    with pytest.raises(C.CompareError, match="set the base model to"):
        C.check_base_match(random_adapter, f"/elsewhere/{name}-other", "a")


@pytest.mark.parametrize(
    ("sampling", "match"),
    [
        (C.Sampling(n=9), "n samples 9"),
        (C.Sampling(max_new_tokens=257), "max new tokens 257"),
        (C.Sampling(temperature=-1), "temperature"),
        (C.Sampling(top_p=0), "top-p"),
        (C.Sampling(seed=-1), "seed"),
    ],
)
def test_sampling_outside_the_caps_is_rejected(sampling, match):
    with pytest.raises(C.CompareError, match=match):
        sampling.check(C.Limits())


def test_prompt_and_reward_errors(tiny_model_dir):
    bank = C.load_bank(tiny_model_dir, ())
    with pytest.raises(C.CompareError, match="prompt is empty"):
        C.compare(bank, "  ", SAMPLING, REWARDS)
    with pytest.raises(C.CompareError, match="limit is 10"):
        C.compare(bank, "x" * 11, SAMPLING, REWARDS, C.Limits(max_prompt_chars=10))
    with pytest.raises(C.CompareError, match="unknown reward function"):
        C.compare(bank, PROMPT, SAMPLING, ["nope"])


def test_limits_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("GRPO_HUB_MAX_SAMPLES", "2")
    assert C.Limits.from_env().max_samples == 2
    monkeypatch.setenv("GRPO_HUB_MAX_SAMPLES", "many")
    with pytest.raises(C.CompareError, match="GRPO_HUB_MAX_SAMPLES='many' must be a positive integer"):
        C.Limits.from_env()


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory"),
    ],
)
def test_out_of_memory_becomes_a_clear_error(tiny_model_dir, random_adapter, monkeypatch, error):
    bank = C.ModelBank(tiny_model_dir, (random_adapter,))

    def out_of_memory(*args, **kwargs):
        raise error

    monkeypatch.setattr(bank.model, "generate", out_of_memory)
    with pytest.raises(C.CompareError, match="out of memory generating for 'base': lower n samples"):
        C.compare(bank, PROMPT, SAMPLING, REWARDS)


def test_other_runtime_errors_are_not_called_out_of_memory(tiny_model_dir, monkeypatch):
    bank = C.ModelBank(tiny_model_dir, ())

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(bank.model, "generate", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        C.compare(bank, PROMPT, SAMPLING, REWARDS)


def test_adapter_that_does_not_fit_the_base_is_named(tiny_model_dir, random_adapter, tmp_path):
    import shutil

    shutil.copytree(random_adapter, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["target_modules"] = ["no_such_proj"]
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(C.CompareError, match=f"adapter '{tmp_path / 'adapter'}' does not fit base"):
        C.ModelBank(tiny_model_dir, (random_adapter, str(tmp_path / "adapter")))


def test_folder_without_a_model_is_not_a_base(tmp_path):
    with pytest.raises(C.CompareError, match="cannot load base model .*Give a causal LM folder or Hub id"):
        C.ModelBank(str(tmp_path), ())
