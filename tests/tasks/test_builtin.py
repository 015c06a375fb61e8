"""Built-in tasks and the offline tiny model: determinism, tokenizer round-trips, rewards, learnability."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_hub.tasks import (
    DEFAULT_TASK,
    SMOKE_TASK,
    TASKS,
    answer_format_reward,
    build_tiny_model,
    digit_fraction_reward,
    get_reward_funcs,
    kind_fraction_reward,
    load_task_dataset,
    math_correctness_reward,
)
from tests.conftest import RUN_LIMIT_S, requires
from tests.recipes.helpers import preset


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_build_is_deterministic_and_cached(tmp_path, tiny_path):
    other = build_tiny_model(tmp_path / "again")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (tmp_path / "again" / name).read_bytes() == Path(tiny_path, name).read_bytes()
    before = (tmp_path / "again" / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(other) == other
    assert (tmp_path / "again" / "model.safetensors").stat().st_mtime_ns == before


def test_seed_changes_weights(tmp_path, tiny_path):
    other = build_tiny_model(tmp_path / "seed1", seed=1)
    assert Path(other, "model.safetensors").read_bytes() != Path(tiny_path, "model.safetensors").read_bytes()


def test_default_folder_honours_cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_HUB_CACHE", str(tmp_path))
    path = build_tiny_model()
    assert Path(path).parent == tmp_path and Path(path, "config.json").is_file()


def test_losing_the_rename_race_keeps_the_winner(tmp_path, monkeypatch):
    """Another process finishes first (its folder appears mid-build): we return its folder, drop ours."""
    import grpo_hub.tasks.tiny_model as tiny_model

    target = tmp_path / "shared"
    real_write = tiny_model._write_model

    def write_and_lose_the_race(folder, seed):
        real_write(folder, seed)
        target.mkdir()
        real_write(target, seed)

    monkeypatch.setattr(tiny_model, "_write_model", write_and_lose_the_race)
    assert build_tiny_model(target) == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared"]


def test_cache_folder_changes_when_the_build_recipe_changes(monkeypatch):
    import grpo_hub.tasks.tiny_model as tiny_model

    before = tiny_model.build_fingerprint(0)
    assert before == tiny_model.build_fingerprint(0) and before != tiny_model.build_fingerprint(1)
    monkeypatch.setitem(tiny_model.MODEL_SHAPE, "initializer_range", 0.02)
    assert tiny_model.build_fingerprint(0) != before


@pytest.mark.slow
def test_two_processes_building_at_once_agree(tmp_path):
    code = "import sys; from grpo_hub.tasks import build_tiny_model; print(build_tiny_model(sys.argv[1]))"
    target = str(tmp_path / "shared")
    procs = [subprocess.Popen([sys.executable, "-c", code, target], stdout=subprocess.PIPE) for _ in range(2)]
    outputs = [p.communicate(timeout=RUN_LIMIT_S)[0].decode().strip().splitlines()[-1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outputs == [target, target]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared"]  # no staging folder left behind


def test_bad_seed_and_half_built_folder_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="seed"):
        build_tiny_model(tmp_path / "x", seed=-1)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    with pytest.raises(FileExistsError, match="output_dir"):
        build_tiny_model(tmp_path / "junk")


def test_model_and_tokenizer_load_and_round_trip(tiny_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    assert model.config.model_type == "qwen2"
    assert model.config.hidden_size // model.config.num_attention_heads >= 32
    assert tokenizer.eos_token_id is not None and tokenizer.pad_token_id is not None
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert model.config.vocab_size == len(tokenizer)
    for text in ["Write only digits: 4 1 7", "12345 0.5,99", "Hello  World!\n\tx", "qqqq zz? #@"]:
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("assistant\n") and "hi" in chat


def test_datasets_are_deterministic_by_seed():
    for task in ("digits", "digits_or_letters"):
        a, b = load_task_dataset(task, n=32, seed=3), load_task_dataset(task, n=32, seed=3)
        assert a.to_list() == b.to_list() and len(a) == 32
        assert a.to_list() != load_task_dataset(task, n=32, seed=4).to_list()
        assert all(isinstance(p, str) and p.startswith("Write only") for p in a["prompt"])
    kinds = set(load_task_dataset("digits_or_letters", n=64)["kind"])
    assert kinds == {"digits", "letters"}
    assert DEFAULT_TASK in TASKS


def test_bad_task_arguments_name_the_fix():
    with pytest.raises(ValueError, match="gsm8k"):
        load_task_dataset("nope")
    with pytest.raises(ValueError, match="positive int"):
        load_task_dataset("digits", n=0)
    with pytest.raises(ValueError, match="dataset_name"):
        load_task_dataset("gsm8k")
    with pytest.raises(ValueError, match="generated offline"):
        load_task_dataset("digits", dataset_name="openai/gsm8k")
    with pytest.raises(ValueError, match="Unknown task"):
        get_reward_funcs("nope")


def test_digit_reward_is_graded():
    completions = ["123", "12ab", "a b c", "", "  ", "7 7 x y"]
    assert digit_fraction_reward(None, completions) == [1.0, 0.5, 0.0, 0.0, 0.0, 0.5]
    conversational = [[{"role": "assistant", "content": "1a"}]]
    assert digit_fraction_reward(None, conversational) == [0.5]


def test_kind_reward_follows_the_prompt():
    completions = ["abc", "abc", "12a!", "12a!"]
    kinds = ["letters", "digits", "digits", "letters"]
    assert kind_fraction_reward(None, completions, kind=kinds) == [1.0, 0.0, 0.5, 0.25]
    with pytest.raises(ValueError, match="kind"):
        kind_fraction_reward(None, ["a"], kind=["vowels"])


def test_reward_funcs_fit_their_dataset_columns():
    for task in ("digits", "digits_or_letters"):
        ds = load_task_dataset(task, n=4)
        extra = {k: ds[k] for k in ds.column_names if k != "prompt"}
        for func in get_reward_funcs(task):
            rewards = func(ds["prompt"], ["12 ab"] * 4, **extra)
            assert len(rewards) == 4 and all(0.0 <= r <= 1.0 for r in rewards)


def test_math_rewards_on_hand_written_completions():
    requires("math_verify", "pip install 'grpo-hub[math]'")
    completions = [
        "3 apples plus 4 apples is 7, so \\boxed{7}",
        "The answer is \\boxed{7.0}",
        "I get \\boxed{8}",
        "no idea",
        [{"role": "assistant", "content": "Total: \\boxed{1,234}"}],
    ]
    solutions = ["7", "7", "7", "7", "1234"]
    assert math_correctness_reward(None, completions, solution=solutions) == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert answer_format_reward(None, completions) == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert answer_format_reward(None, ["\\boxed{1} or \\boxed{2}"]) == [0.0]


def test_gsm8k_task_loads_a_local_dataset(tmp_path):
    requires("math_verify", "pip install 'grpo-hub[math]'")
    rows = [
        {"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i:,}"}
        for i in range(600, 610)
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    ds = load_task_dataset("gsm8k", n=4, seed=0, dataset_name=str(tmp_path))
    assert (
        len(ds) == 4
        and ds.to_list() == load_task_dataset("gsm8k", n=4, seed=0, dataset_name=str(tmp_path)).to_list()
    )
    assert ds[0]["prompt"][0]["role"] == "system" and ds[0]["prompt"][1]["content"].startswith("What is")
    first = int(ds[0]["prompt"][1]["content"].split()[2])
    assert ds[0]["solution"] == str(2 * first)
    funcs = get_reward_funcs("gsm8k")
    good = [f"\\boxed{{{2 * first}}}"]
    assert [f(ds["prompt"][:1], good, solution=ds["solution"][:1])[0] for f in funcs] == [1.0, 1.0]


@pytest.mark.slow
def test_plain_trl_grpo_raises_the_digit_reward(tiny_path, tmp_path):
    """30 LoRA GRPO steps with plain TRL and the recipe's smoke settings: the mean reward must clearly rise."""
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg = preset("grpo.yaml")  # the recipe's `--task digits` settings
    trained = ("learning_rate", "max_steps", "num_generations", "per_device_train_batch_size")
    trained += ("max_completion_length", "beta", "temperature", "loss_type", "logging_steps", "save_strategy")
    rewards = []

    class RecordReward(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                rewards.append(logs["reward"])

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        seed=0,
        disable_tqdm=True,
        **{k: cfg[k] for k in trained},
    )
    peft_config = LoraConfig(
        r=cfg["lora_r"],
        lora_alpha=cfg["lora_alpha"],
        target_modules=cfg["lora_target_modules"],
        lora_dropout=cfg["lora_dropout"],
        task_type="CAUSAL_LM",
    )
    trainer = GRPOTrainer(
        model=tiny_path,
        reward_funcs=get_reward_funcs(SMOKE_TASK),
        args=args,
        train_dataset=load_task_dataset(SMOKE_TASK, n=512, seed=0),
        peft_config=peft_config,
        callbacks=[RecordReward()],
    )
    trainer.train()
    assert len(rewards) == cfg["max_steps"]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, f"reward did not rise: first 5 steps {first:.3f}, last 5 {last:.3f}"
