"""recipes/grpo.py: default run (subprocess, learns), every YAML parses, few-step runs of each CPU config, CLI errors."""

import json
import sys

import pytest
import yaml

from tests.conftest import RUN_LIMIT_S, requires
from tests.recipes.helpers import (
    CONFIGS,
    RECIPE,
    SMALL_EVAL,
    launch,
    load_recipe,
    one_line_error,
    parse,
    preset,
)
from tests.training.distributed.launch import launch_env, run_isolated

CPU_CONFIGS = ("grpo", "gspo", "cispo", "filtered", "ref-refresh")
ARITHMETIC_CONFIGS = ("arithmetic", "arithmetic-full")  # run by tests/recipes/test_arithmetic_recipe.py
CHAIN_FAST = {
    "selective_rollout": True,
    "selective_rollout_revisit_after": 1,
}  # the recommended preset's switch
# the main job, the recommended preset, step credit and the time-to-accuracy testbed
# (benchmarks/accuracy/time_to_accuracy.py)
CHAIN_CONFIGS = (
    "chain",
    "chain-fast",
    "chain-steps",
    "chain-full",
    "chain-full-fast",
)
STEP_CREDIT = ["chain_correctness_reward", "chain_step_reward"]  # chain-steps.yaml's rewards
FULL_FINE_TUNING = ("arithmetic-full", "chain-full", "chain-full-fast")
SERVER_CONFIGS = ("chain-server", "chain-async")  # the main job with generation on a local vLLM server
ALL_CONFIGS = (
    *CPU_CONFIGS,
    *ARITHMETIC_CONFIGS,
    *CHAIN_CONFIGS,
    *SERVER_CONFIGS,
    "vllm-colocate",
    "qwen2.5-0.5b-math",
)


@pytest.fixture(scope="module")
def recipe():
    return load_recipe()


@pytest.mark.slow
def test_default_run_learns_the_chain_task_and_saves_the_adapter(tmp_path):
    """The README's main job learns: held-out accuracy (2,000 problems) gains >= 6 points (measured +10: 0.30 ->
    0.40, docs/tasks.md; the issue's goal of +15 is not met). Greedy decoding of a fixed model is deterministic,
    so the gain is the policy's, not sampling noise."""
    summary, out = launch(tmp_path)
    assert summary["task"] == "chain" and summary["peft"] is True
    assert summary["steps"] == 200 and summary["world_size"] == 1 and len(summary["rewards"]) == 200
    assert summary["mean_pad_share"] < 0.03, (
        summary
    )  # chain.yaml turns padding_free on (TRL's forwards: ~1/3)
    before, after = summary["heldout_before"]["greedy"]["all"], summary["heldout_after"]["greedy"]["all"]
    assert after >= before + 0.06, summary
    assert (
        "held-out accuracy before -> after (per level = steps in the chain)"
        in (tmp_path / "console.log").read_text()
    )
    assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    assert not (out / "ref").exists()


@pytest.mark.slow
def test_digits_task_by_flag_learns_with_the_tiny_settings(tmp_path):
    summary, out = launch(tmp_path, "--task", "digits")
    assert summary["task"] == "digits" and summary["steps"] == 30 and len(summary["rewards"]) == 30
    # stdout is a pipe: one plain line per step, no progress-bar redraws (issue 32)
    console = (tmp_path / "console.log").read_text()
    assert "\r" not in console
    assert [line.split()[1] for line in console.splitlines() if line.startswith("step ")] == [
        f"{step}/30" for step in range(1, 31)
    ]
    assert summary["reward_last"] > summary["reward_first"] + 0.3, summary
    assert "heldout_before" not in summary and (out / "adapter_model.safetensors").is_file()


def resolved(recipe, *argv) -> list[dict]:
    """The recipe's parsed (RecipeArguments, GRPOHubConfig, ModelConfig) for `argv`, as plain mappings."""
    recipe_args, training_args, model_args = parse(recipe, *argv)
    return [vars(recipe_args), training_args.to_dict(), vars(model_args)]


def test_the_defaults_are_the_task_presets_read_from_their_yaml(recipe):
    """No arguments = chain.yaml, `--task digits` = grpo.yaml, key for key; another task keeps grpo.yaml's rest."""
    assert resolved(recipe) == resolved(recipe, "--config", str(CONFIGS / "chain.yaml"))
    assert resolved(recipe, "--task", "digits") == resolved(recipe, "--config", str(CONFIGS / "grpo.yaml"))
    other = resolved(recipe, "--task=digits_or_letters")
    assert other[0]["task"] == "digits_or_letters"
    assert other[1:] == resolved(recipe, "--config", str(CONFIGS / "grpo.yaml"))[1:]
    chain, tiny = preset("chain.yaml"), preset("grpo.yaml")
    assert (
        chain["output_dir"] == "outputs/chain" and tiny["output_dir"] == "outputs/grpo-tiny"
    )  # README's folders
    assert chain["learning_rate"] != tiny["learning_rate"]  # the two defaults are really different presets


def test_a_preset_with_a_base_states_only_what_differs_from_it():
    children = [path for path in sorted(CONFIGS.glob("*.yaml")) if "base" in yaml.safe_load(path.read_text())]
    assert len(children) >= 8
    for path in children:
        own = yaml.safe_load(path.read_text())
        parent = preset(own.pop("base"))
        same = sorted(key for key, value in own.items() if key in parent and parent[key] == value)
        assert not same, f"{path.name} repeats its parent's {same}: drop them"


def test_pass_k_outside_the_arithmetic_task_is_refused(recipe, capsys):
    assert one_line_error(recipe, capsys, "--eval_pass_k", "8").startswith("grpo.py: error: `eval_pass_k`: ")


def test_eval_per_level_needs_a_scored_task_and_at_most_its_held_out_problems(recipe, capsys):
    unscored = one_line_error(recipe, capsys, "--task", "digits", "--eval_per_level", "5")
    assert unscored.startswith("grpo.py: error: `eval_per_level`: ") and "drop --eval_per_level" in unscored
    assert "holds out 500 per level" in one_line_error(recipe, capsys, "--eval_per_level", "501")
    assert "holds out 50 per level" in one_line_error(
        recipe, capsys, "--task", "arithmetic", "--eval_per_level", "51"
    )
    assert one_line_error(recipe, capsys, "--eval_per_level", "0").startswith(
        "grpo.py: error: `eval_per_level`: "
    )
    assert parse(recipe, "--eval_per_level", "500")[0].eval_per_level == 500


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("config", ["chain", "chain-steps"])
def test_two_cpu_ranks_with_the_ddp_accelerate_config(tmp_path, config):
    summary, out = launch(
        tmp_path, "--config", str(CONFIGS / f"{config}.yaml"), "--max_steps", "4", *SMALL_EVAL,
        accelerate_config="cpu-ddp.yaml",
    )  # fmt: skip
    assert summary["world_size"] == 2 and summary["steps"] == 4
    logged = json.loads((out / "grpo_run.json").read_text())["log_history"][0]
    names = {key.split("/")[1] for key in logged if key.startswith("rewards/") and key.endswith("/mean")}
    assert names == set(STEP_CREDIT if config == "chain-steps" else STEP_CREDIT[:1])
    assert summary["heldout_per_level"] == 20 and set(summary["heldout_after"]["greedy"]) == {
        "1",
        "2",
        "3",
        "4",
        "all",
    }
    assert (
        "held-out accuracy before -> after (per level = steps in the chain, 20 problems each)"
        in (tmp_path / "console.log").read_text()
    )
    assert (out / "adapter_model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_colocate_config_runs_in_the_vllm_env(tmp_path):
    from tests.training.vllm.engine import vllm_env, vllm_python

    out = tmp_path / "out"
    command = [
        vllm_python(), str(RECIPE), "--config", str(CONFIGS / "vllm-colocate.yaml"),
        "--max_steps", "3", "--output_dir", str(out), "--use_cpu", "true", "--bf16", "false",
    ]  # fmt: skip
    run_isolated(command, tmp_path, vllm_env(), "vLLM recipe run")
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["steps"] == 3 and len(summary["rewards"]) == 3
    assert (out / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_every_config_parses(recipe, name):
    recipe_args, training_args, model_args = parse(recipe, "--config", str(CONFIGS / f"{name}.yaml"))
    assert model_args.use_peft == (name not in FULL_FINE_TUNING) and training_args.output_dir.startswith(
        "outputs/"
    )
    expected = {
        "gspo": {"importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
        "cispo": {"loss_type": "cispo", "epsilon_high": 5.0},
        "filtered": {"filter_zero_signal": True, "adv_clip_range": 2.0},
        "ref-refresh": {"ref_adapter_sync_on": "steps", "ref_adapter_sync_steps": 10, "beta": 0.04},
        "vllm-colocate": {"use_vllm": True, "vllm_mode": "colocate"},
        "qwen2.5-0.5b-math": {"use_vllm": True, "max_completion_length": 512},
        "arithmetic": {"num_generations": 8, "max_completion_length": 8},
        "arithmetic-full": {"num_generations": 8, "max_completion_length": 8},
        "chain": {"num_generations": 8, "max_completion_length": 48, "learning_rate": 1e-3},
        "chain-full": {
            "max_completion_length": 48,
            "learning_rate": 1e-4,
            "lr_scheduler_type": "constant",
            "padding_free": False,
        },
        "chain-fast": {**CHAIN_FAST, "max_completion_length": 48, "learning_rate": 1e-3},
        "chain-steps": {"reward_weights": [1.0, 0.5], "max_completion_length": 48, "learning_rate": 1e-3},
        "chain-full-fast": {
            **CHAIN_FAST,
            "learning_rate": 1e-4,
            "lr_scheduler_type": "constant",
            "padding_free": True,
        },
        "chain-server": {"vllm_mode": "server", "max_staleness": 0, "learning_rate": 1e-3},
        "chain-async": {"vllm_mode": "server", "max_staleness": 1, "learning_rate": 1e-3},
    }.get(name, {"loss_type": "dapo", "learning_rate": 3e-2})
    assert {k: getattr(training_args, k) for k in expected} == expected
    if name == "qwen2.5-0.5b-math":
        assert recipe_args.task == "gsm8k" and recipe_args.dataset_name == "openai/gsm8k"
        assert model_args.model_name_or_path == "Qwen/Qwen2.5-0.5B-Instruct"
    elif name in ARITHMETIC_CONFIGS:
        assert recipe_args.task == "arithmetic" and model_args.model_name_or_path is None
    elif name in CHAIN_CONFIGS or name in SERVER_CONFIGS:
        assert recipe_args.task == "chain" and model_args.model_name_or_path is None
        assert recipe_args.vllm_server_start == (name in SERVER_CONFIGS)
        assert recipe_args.reward_funcs == (STEP_CREDIT if name == "chain-steps" else None)
    else:
        assert recipe_args.task == "digits" and model_args.model_name_or_path is None


@pytest.mark.parametrize("flag", ["--vllm_server_cores", "--vllm_server_gpus"])
def test_server_placement_needs_a_local_server(recipe, capsys, flag):
    line = one_line_error(recipe, capsys, "--use_vllm", "true", "--vllm_mode", "server", flag, "1")
    assert line.startswith(f"grpo.py: error: `{flag[2:]}`: places the local vLLM server") and (
        "Fix: add --vllm_server_start true" in line
    )


def test_a_local_server_without_vllm_is_one_line_before_anything_loads(recipe, capsys, monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    args = parse(recipe, "--config", str(CONFIGS / "chain-server.yaml"), "--output_dir", str(tmp_path))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info, recipe.local_vllm_server(*args[:2], "chain", None):
        pass
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("grpo.py: error: --vllm_server_start needs vLLM") and "grpo-hub[vllm]" in err


def test_reward_funcs_are_named_from_the_task_and_reward_weights_count_them(recipe, capsys):
    unknown = one_line_error(
        recipe, capsys, "--reward_funcs", "chain_correctness_reward", "digit_fraction_reward"
    )
    assert (
        unknown.startswith("grpo.py: error: `reward_funcs`: ")
        and "unknown ['digit_fraction_reward']" in unknown
    )
    assert "choose from chain_correctness_reward, chain_step_reward" in unknown
    repeated = one_line_error(recipe, capsys, "--reward_funcs", "chain_step_reward", "chain_step_reward")
    assert "repeated ['chain_step_reward']" in repeated
    weights = one_line_error(recipe, capsys, "--reward_funcs", *STEP_CREDIT, "--reward_weights", "1.0")
    assert weights.startswith("grpo.py: error: `reward_weights`: 1 weights for the 2 reward function(s)")
    assert "digits" in one_line_error(
        recipe, capsys, "--task", "digits", "--reward_funcs", "chain_step_reward"
    )


def test_chain_steps_trains_on_both_rewards_weighted(recipe, tmp_path, monkeypatch):
    """chain-steps.yaml's run logs both rewards, and its reward is correctness + 0.5 x step credit."""
    built = []

    class Recorded(recipe.GRPOHubTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(recipe, "GRPOHubTrainer", Recorded)
    args = parse(
        recipe,
        "--config", str(CONFIGS / "chain-steps.yaml"),
        "--max_steps", "1", "--num_prompts", "8", "--eval_per_level", "2", "--output_dir", str(tmp_path),
        "--use_cpu", "true", "--bf16", "false",
    )  # fmt: skip
    recipe.main(*args)
    logged = built[0].state.log_history[0]
    right, steps = (logged[f"rewards/{name}/mean"] for name in STEP_CREDIT)
    assert 0 < steps < 1 and logged["reward"] == pytest.approx(right + 0.5 * steps)


def test_cli_overrides_the_yaml(recipe):
    _, training_args, _ = parse(recipe, "--config", str(CONFIGS / "grpo.yaml"), "--max_steps", "7")
    assert training_args.max_steps == 7


@pytest.mark.parametrize("name", CPU_CONFIGS)
def test_each_cpu_config_runs_a_few_steps(recipe, name, tmp_path):
    args = parse(
        recipe,
        "--config", str(CONFIGS / f"{name}.yaml"),
        "--max_steps", "2", "--num_prompts", "32", "--output_dir", str(tmp_path),
        "--use_cpu", "true", "--bf16", "false",
    )  # fmt: skip
    summary = recipe.main(*args)
    generations = 2 // args[1].num_iterations  # rewards are logged on the steps that generate
    assert summary["steps"] == 2 and len(summary["rewards"]) == generations
    assert all(0.0 <= r <= 1.0 for r in summary["rewards"])
    assert json.loads((tmp_path / "run_summary.json").read_text()) == summary
    assert (tmp_path / "adapter_model.safetensors").is_file() and not (tmp_path / "ref").exists()


def test_unknown_task_is_a_clear_cli_error(recipe, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(recipe, "--task", "chess")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "`task`" in err and "invalid choice" in err and "digits" in err


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--num_prompts", "0"], "`num_prompts`"),
        (["--loss_type", "ppo"], "`loss_type`"),
        (
            [
                "--config",
                str(CONFIGS / "grpo.yaml"),
                "--filter_zero_signal",
                "true",
                "--num_generations",
                "1",
            ],
            "num_generations",
        ),
    ],
)
def test_bad_values_name_the_flag(recipe, capsys, argv, names):
    assert names in one_line_error(recipe, capsys, *argv)


def test_gsm8k_task_trains_on_a_local_dataset(recipe, tmp_path):
    """The realistic task's path end to end: local GSM8K-style jsonl, chat prompts, math_verify rewards."""
    requires("math_verify", "pip install 'grpo-hub[math]'")
    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(16)
    ]
    (data / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    args = parse(
        recipe,
        "--task", "gsm8k", "--dataset_name", str(data), "--num_prompts", "8",
        "--max_steps", "2", "--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--bf16", "false",
    )  # fmt: skip
    summary = recipe.main(*args)
    assert summary["task"] == "gsm8k" and summary["steps"] == 2 and len(summary["rewards"]) == 2
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()


def test_gsm8k_without_dataset_name_names_the_flag(recipe, tmp_path):
    args = parse(recipe, "--task", "gsm8k", "--output_dir", str(tmp_path))
    with pytest.raises(ValueError, match="dataset_name"):
        recipe.main(*args)


def test_task_choices_match_grpo_hub_tasks(recipe):
    import typing

    from grpo_hub.tasks import TASKS

    hints = typing.get_type_hints(recipe.RecipeArguments)
    assert typing.get_args(hints["task"]) == TASKS


@pytest.mark.parametrize(
    ("argv", "yaml_text", "expected"),
    [
        (["--learnig_rate", "1e-3"], None, "unknown flag --learnig_rate (did you mean --learning_rate?)"),
        (["--max_step", "3"], None, "unknown flag --max_step (did you mean --max_steps?)"),  # no prefixes
        (["--task=digits", "--zzzz", "1"], None, "unknown flag --zzzz"),
        (
            [],
            "task: digits\nlearnig_rate: 0.1\n",
            "unknown key learnig_rate (did you mean learning_rate?) in",
        ),
        (["--max_steps", "many"], None, "`max_steps`: invalid int value: 'many'. Fix: give an integer."),
    ],
    ids=["flag", "prefix", "no-close-match", "yaml-key", "bad-value"],
)
def test_a_typo_costs_one_line(recipe, capsys, tmp_path, argv, yaml_text, expected):
    if yaml_text is not None:
        (tmp_path / "c.yaml").write_text(yaml_text)
        argv = [*argv, "--config", str(tmp_path / "c.yaml")]
    with pytest.raises(SystemExit) as exit_info:
        parse(recipe, *argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("grpo.py: error: ") and expected in err, err


def test_a_missing_config_file_is_one_line(recipe, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        parse(recipe, "--config", str(tmp_path / "nope.yaml"))
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err
        == f"grpo.py: error: --config {tmp_path / 'nope.yaml'}: No such file or directory\n"
    )


def test_unknown_flag_from_the_command_line_has_no_traceback(tmp_path):
    """The script itself (not the parser in-process): one line on stderr, status 2."""
    import subprocess

    done = subprocess.run(
        [sys.executable, str(RECIPE), "--learnig_rate", "1e-3"],
        cwd=tmp_path, env=launch_env(), capture_output=True, text=True, timeout=RUN_LIMIT_S,
    )  # fmt: skip
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert errors == ["grpo.py: error: unknown flag --learnig_rate (did you mean --learning_rate?)"]
