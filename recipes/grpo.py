"""GRPO recipe: `GRPOHubTrainer` on a built-in task, following `trl/scripts/grpo.py`.

    accelerate launch recipes/grpo.py                                         # the chain task, ~5 min on 2 CPU cores
    accelerate launch recipes/grpo.py --task digits                           # smoke task on the random tiny model, ~30 s
    accelerate launch recipes/grpo.py --config recipes/configs/gspo.yaml      # any preset
    accelerate launch --config_file recipes/accelerate/cpu-ddp.yaml recipes/grpo.py   # 2 CPU ranks

With no arguments it trains a LoRA adapter on the shipped chain model (`grpo_hub.tasks.chain_model_path`) for
the built-in "chain" task (multi-step arithmetic with a scratchpad) with the settings it reads from
recipes/configs/chain.yaml and prints held-out accuracy before -> after. `--task digits` (or any task other than
"chain") starts from the random tiny model with the settings it reads from recipes/configs/grpo.yaml (lr 3e-2,
4 generations, 16 completion tokens). Those defaults suit only the offline models: for a real model
(`--model_name_or_path Qwen/...`) start from `recipes/configs/qwen2.5-0.5b-math.yaml`. On a machine without CUDA
the defaults are `use_cpu=True, bf16=False`.

Every `GRPOHubConfig`, `ModelConfig` and `RecipeArguments` field is a flag or a YAML key (`--config`).
At the end the main process prints a summary (steps, world size, mean reward of the first vs last logged
steps, time, where the model was saved) and writes it to `<output_dir>/run_summary.json`. For "chain" and
"arithmetic" (`recipes/configs/arithmetic.yaml`, the offline arithmetic model) the summary adds held-out
accuracy per level before -> after and the mean all-correct / all-wrong group shares.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import logging
import os
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import yaml
from accelerate import PartialState
from accelerate.utils import is_peft_model
from peft.utils.error import NoMatchingPeftModuleError
from transformers import TrainerCallback
from trl import ModelConfig, TrlParser, get_peft_config
from trl.models import unwrap_model_for_generation

from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.config import config_files, cpu_threads, flag_values, value_ranges
from grpo_hub.errors import field_error, field_message
from grpo_hub.generation import server_process
from grpo_hub.hub import HubPushCallback
from grpo_hub.records.console import plain_upstream_bars, quiet_upstream_warnings, use_compact_progress
from grpo_hub.tasks import (
    DEFAULT_TASK,
    OFFLINE_MODELS,
    SCORED_TASKS,
    TASKS,
    build_tiny_model,
    get_reward_funcs,
    load_task_dataset,
)

logger = logging.getLogger(__name__)
SUMMARY_FILE = "run_summary.json"
SUMMARY_WINDOW = 5  # steps averaged at each end of the reward history
LEVEL_MEANING = {"chain": "steps in the chain", "arithmetic": "digits of the first operand"}
PRESETS = Path(__file__).resolve().parent / "configs"
TASK_PRESETS = {"chain": "chain.yaml"}  # a task's defaults, written out; any other task runs SMOKE_PRESET's
SMOKE_PRESET = "grpo.yaml"  # the random tiny model's settings


@dataclass
class RecipeArguments:
    """Which task and data the recipe trains on."""

    task: Literal["chain", "digits", "digits_or_letters", "arithmetic", "gsm8k"] = field(
        default=DEFAULT_TASK,
        metadata={
            "help": "Built-in task (grpo_hub.tasks): 'chain' (default), 'digits', 'digits_or_letters' and "
            "'arithmetic' are generated offline; 'gsm8k' needs --dataset_name and the math extra."
        },
    )
    num_prompts: int = field(default=512, metadata={"help": "Number of prompts (dataset rows) to train on."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed for generating / shuffling the prompts."})
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "For task 'gsm8k': Hub dataset id (e.g. 'openai/gsm8k') or local path."},
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "For task 'gsm8k': dataset configuration name (e.g. 'main')."}
    )
    dataset_train_split: str = field(
        default="train", metadata={"help": "For task 'gsm8k': split to train on."}
    )
    eval_pass_k: int = field(
        default=0,
        metadata={
            "help": "For task 'arithmetic': also report held-out pass@k (k samples per problem) before and "
            "after training; 0 reports greedy accuracy only."
        },
    )
    full_logs: bool = field(
        default=False,
        metadata={
            "help": "Print TRL's full metric dict at every logging step instead of the compact progress line."
        },
    )
    vllm_server_start: bool = field(
        default=False,
        metadata={
            "help": "With use_vllm and vllm_mode 'server': start a local vLLM server of the model on "
            "vllm_server_port for this run (stopped on every exit), instead of connecting to vllm_server_base_url."
        },
    )
    vllm_server_cores: str | None = field(
        default=None,
        metadata={
            "help": "With vllm_server_start: the CPU cores of the local server (e.g. '1' or '2-3'); the trainer "
            "processes then run on the other cores."
        },
    )
    vllm_server_gpus: str | None = field(
        default=None,
        metadata={
            "help": "With vllm_server_start: the GPUs of the local server (CUDA_VISIBLE_DEVICES, e.g. '1')."
        },
    )

    def __post_init__(self):
        value_ranges.check_ranges(self, RECIPE_RANGES)
        for name in ("vllm_server_cores", "vllm_server_gpus"):
            if getattr(self, name) is not None and not self.vllm_server_start:
                field_error(
                    name,
                    "places the local vLLM server, which only --vllm_server_start true starts.",
                    f"add --vllm_server_start true, or drop --{name}.",
                )
        if self.vllm_server_cores is not None:
            server_process.parse_cores(self.vllm_server_cores)
        if self.eval_pass_k and self.task != "arithmetic":
            field_error(
                "eval_pass_k",
                f"is reported for --task arithmetic only, got --task {self.task}.",
                "drop --eval_pass_k.",
            )


RECIPE_RANGES = (
    value_ranges.Range("num_prompts", 1),
    value_ranges.Range("dataset_seed", 0, value_ranges.SEED_MAX, why="numpy's seed range"),
    value_ranges.Range("eval_pass_k", 0, why="0 reports greedy accuracy only"),
)


def task_preset(task: str) -> Path:
    """The YAML whose settings are the recipe's defaults for `task` run on its offline model."""
    return PRESETS / TASK_PRESETS.get(task, SMOKE_PRESET)


def fail(message: str):
    """Exit with argparse's status 2 after one line on stderr: no traceback, no usage screen (it lists every field)."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)  # a YAML key may hold a newline
    sys.stderr.write(f"grpo.py: error: {line}\n")
    raise SystemExit(2)


def unknown_name(kind: str, name: str, known: list[str]) -> str:
    """'unknown flag --learnig_rate (did you mean --learning_rate?)': the closest known name, when one is close."""
    close = difflib.get_close_matches(name, known, n=1)
    return f"unknown {kind} {name}" + (f" (did you mean {close[0]}?)" if close else "")


def read_config(path: str) -> dict:
    """The `--config` YAML as a mapping, merged over the parent it names (`base:`, see
    `grpo_hub.config.config_files`); a missing, unreadable or non-mapping file is a one-line error."""
    try:
        return config_files.read_config(path)
    except OSError as error:
        fail(f"--config {path}: {error.strerror}")
    except yaml.YAMLError as error:
        fail(f"--config {path}: not valid YAML ({' '.join(str(error).split())})")
    except ValueError as error:
        fail(f"--config {path}: {error}")


def requested_task(argv: list[str]) -> str:
    """The task named by `--task`, else by the `--config` YAML, else `DEFAULT_TASK` (read before parsing, so
    the parser's defaults can be that task's)."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--task")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    if known.task:
        return known.task
    task = read_config(known.config).get("task") if known.config else None
    known_task = isinstance(task, str) and task in TASKS  # an unknown one is refused when the YAML is parsed
    return task if known_task else DEFAULT_TASK


class RecipeParser(TrlParser):
    """TrlParser whose every complaint is one line naming the field (exit status 2), instead of a traceback or the
    usage screen: unknown flags and YAML keys (with the closest name), prefixes of flags (`allow_abbrev=False`),
    values argparse refuses, YAML values the flag would refuse (`flag_values.yaml_value`), and every value the
    dataclasses refuse when built (GRPOHubConfig's checks, TRL's and transformers' own) or `check_parsed` refuses."""

    def __init__(self, dataclass_types):
        super().__init__(dataclass_types, allow_abbrev=False)
        self.annotations = {
            name: annotation
            for kind in dataclass_types
            for name, annotation in typing.get_type_hints(kind).items()
        }

    def error(self, message: str):
        fail(flag_values.argparse_field_error(message, self._actions, self.annotations))

    def parse_args_and_config(self, args=None, **kwargs):
        args = list(sys.argv[1:] if args is None else args)
        flags = sorted(flag for action in self._actions for flag in action.option_strings)
        for token in args:
            flag = token.split("=", 1)[0]
            if flag.startswith("--") and flag not in ("--", "--config") and flag not in flags:
                fail(unknown_name("flag", flag, flags))
        if "--config" in args:  # read here (TrlParser would not follow `base:`), then parsed as TRL does
            at = args.index("--config")
            if at + 1 == len(args):
                fail("--config needs a YAML file. Fix: --config PATH.")
            self.set_defaults_with_config(**self.yaml_settings(args[at + 1]))
            args = args[:at] + args[at + 2 :]
        try:
            parsed = super().parse_args_and_config(args, **kwargs)
            check_parsed(*parsed)
        except (
            ValueError
        ) as error:  # a value a dataclass or check_parsed refuses; the message names the field
            fail(" ".join(str(error).split()))
        return parsed

    def yaml_settings(self, path: str) -> dict:
        """The `--config` file's settings, each checked as its flag would be; its `env:` mapping is exported."""
        config = read_config(path)
        actions = {action.dest: action for action in self._actions if action.option_strings}
        for key in config:
            if key != "env" and key not in actions:
                fail(f"{unknown_name('key', str(key), sorted(actions))} in --config {path}")
        env = config.pop("env", None)
        env = {} if env is None else env
        if not isinstance(env, dict):
            fail(
                f"`env`: must map variable names to values, got {env!r} (in --config {path}). Fix: env: {{NAME: 1}}."
            )
        try:
            settings = {
                key: flag_values.yaml_value(actions[key], self.annotations[key], key, value)
                for key, value in config.items()
            }
        except ValueError as error:
            fail(f"{error} (in --config {path})")
        os.environ.update({str(key): str(value) for key, value in env.items()})
        return settings


def check_parsed(recipe_args: RecipeArguments, training_args: GRPOHubConfig, model_args: ModelConfig) -> None:
    """What the values alone decide across the three dataclasses, before a model or dataset is loaded."""
    value_ranges.check_ranges(model_args, value_ranges.MODEL_RANGES)
    for settings in (recipe_args, model_args):
        value_ranges.check_non_empty(settings)
    value_ranges.check_model_source(model_args.model_name_or_path)
    value_ranges.check_model_choices(model_args)
    rewards = len(get_reward_funcs(recipe_args.task))
    if training_args.reward_weights is not None and len(training_args.reward_weights) != rewards:
        field_error(
            "reward_weights",
            f"{len(training_args.reward_weights)} weights for task {recipe_args.task!r}, which has {rewards} "
            "reward function(s).",
            f"give {rewards} weight(s), or drop --reward_weights.",
        )


def recipe_defaults(task: str, has_cuda: bool) -> dict:
    """Parser defaults of the offline run of `task`: its preset's keys, on the machine's device (a YAML `--config`
    and CLI flags override them)."""
    return {**config_files.read_config(task_preset(task)), "use_cpu": not has_cuda, "bf16": has_cuda}


def make_parser(argv: list[str] | None = None) -> TrlParser:
    """RecipeParser over (RecipeArguments, GRPOHubConfig, ModelConfig) with the defaults of the task `argv` names."""
    parser = RecipeParser((RecipeArguments, GRPOHubConfig, ModelConfig))
    task = requested_task(sys.argv[1:] if argv is None else argv)
    parser.set_defaults(**recipe_defaults(task, torch.cuda.is_available()))
    return parser


ZERO_SIGNAL_KINDS = ("zero_signal/frac_groups_all_max", "zero_signal/frac_groups_all_min")


class RewardHistory(TrainerCallback):
    """Record the mean reward (and the zero-signal group shares) logged at every logging step (all ranks)."""

    def __init__(self):
        self.rewards: list[float] = []
        self.zero_signal: dict[str, list[float]] = {key: [] for key in ZERO_SIGNAL_KINDS}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.rewards.append(float(logs["reward"]))
            for key, values in self.zero_signal.items():
                if key in logs:
                    values.append(float(logs[key]))


def reward_trend(rewards: list[float], window: int = SUMMARY_WINDOW) -> tuple[float, float]:
    """Mean of the first and of the last `window` rewards (window shrinks to half the history if shorter)."""
    if not rewards:
        raise ValueError("no reward was logged; set --logging_steps to at most --max_steps")
    k = max(1, min(window, len(rewards) // 2))
    return sum(rewards[:k]) / k, sum(rewards[-k:]) / k


def summarize(
    trainer, history: RewardHistory, train_output, wall_seconds: float, model_name: str, task: str
) -> dict:
    """The end-of-run summary the recipe prints and writes."""
    first, last = reward_trend(history.rewards)
    return {
        "model": model_name,
        "task": task,
        "steps": trainer.state.global_step,
        "world_size": trainer.accelerator.num_processes,
        "torch_threads": torch.get_num_threads(),
        "peft": is_peft_model(trainer.model),
        "reward_first": round(first, 4),
        "reward_last": round(last, 4),
        "rewards": [round(r, 4) for r in history.rewards],
        **{
            f"mean_{key.split('/')[-1]}": round(sum(values) / len(values), 4)
            for key, values in history.zero_signal.items()
            if values
        },
        "train_seconds": round(train_output.metrics["train_runtime"], 1),
        "wall_seconds": round(wall_seconds, 1),
        "saved_to": str(Path(trainer.args.output_dir).resolve()),
    }


def hub_push_callback(training_args: GRPOHubConfig, model_name: str) -> HubPushCallback:
    """`--push_to_hub`: grpo_hub's adapter-only pushes (checkpoint-N -> branch step-N, final -> main) replace
    Trainer's own, which would upload the whole output folder (ref adapter, training_args.bin)."""
    if not training_args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id (e.g. your-name/tiny-grpo-lora).")
    training_args.push_to_hub = False
    return HubPushCallback(
        training_args.hub_model_id,
        base_model=model_name,
        token=training_args.hub_token,
        private=training_args.hub_private_repo,
        push_checkpoints=training_args.save_strategy != "no",
    )


@contextlib.contextmanager
def local_vllm_server(recipe_args: RecipeArguments, training_args: GRPOHubConfig, model_name: str, lora_rank):
    """`--vllm_server_start`: the local main process starts a vLLM server of `model_name` for the `with` block (the
    other ranks connect to it: TRL talks to the server from the main process only); with `--vllm_server_cores` this
    process runs on the other cores."""
    if not recipe_args.vllm_server_start:
        yield
        return
    if not (training_args.use_vllm and training_args.vllm_mode == "server"):
        fail(
            "--vllm_server_start: a local server serves vllm_mode 'server'. Fix: add --use_vllm true --vllm_mode server."
        )
    try:
        server_process.require_vllm("--vllm_server_start")
    except ValueError as error:
        fail(str(error))
    training_args.vllm_server_base_url = f"http://127.0.0.1:{training_args.vllm_server_port}"
    if recipe_args.vllm_server_cores is not None:
        rest = set(os.sched_getaffinity(0)) - server_process.parse_cores(recipe_args.vllm_server_cores)
        if not rest:
            fail(f"--vllm_server_cores {recipe_args.vllm_server_cores}: no core is left for training. Fix: give the "
                 "server fewer cores.")  # fmt: skip
        os.sched_setaffinity(0, rest)
        torch.set_num_threads(len(rest))
    if not PartialState().is_local_main_process:
        yield
        return
    # LoRA only where the adapter sync may run: vLLM's CPU platform turns compilation off with it (docs/vllm.md)
    may_serve_adapter = training_args.vllm_server_sync == "adapter" or (
        training_args.vllm_server_sync == "auto" and recipe_args.vllm_server_gpus is not None
    )
    argv = server_process.server_command(
        model_name,
        port=training_args.vllm_server_port,
        dtype="bfloat16" if training_args.bf16 else "float32",  # what the trainer computes in
        lora_rank=lora_rank if may_serve_adapter else None,
    )
    env = server_process.server_env(
        os.environ, cores=recipe_args.vllm_server_cores, gpus=recipe_args.vllm_server_gpus
    )
    log = Path(training_args.output_dir, "vllm-server.log")
    with server_process.LocalServer(
        argv, env, log, timeout=training_args.vllm_server_timeout, cores=recipe_args.vllm_server_cores
    ):
        yield


def use_cpu_cores(training_args: GRPOHubConfig) -> None:
    """A CPU-only run trains on every core it may use unless the user chose a thread count
    (`grpo_hub.config.cpu_threads`); the main process says which."""
    if training_args.device.type != "cpu":
        return
    state = PartialState()
    line = cpu_threads.use_machine_cores(state.num_processes)
    if state.is_main_process:
        print(line, flush=True)


def heldout_accuracy(trainer, recipe_args: RecipeArguments) -> dict:
    """Held-out accuracy per level of the model being trained (every rank generates: ZeRO-3 needs all)."""
    extra = {"pass_k": recipe_args.eval_pass_k} if recipe_args.eval_pass_k else {}
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        return SCORED_TASKS[recipe_args.task].evaluate(model, trainer.processing_class, "heldout", **extra)


def accuracy_line(before: dict, after: dict) -> str:
    """One clause per metric of `arithmetic.evaluate`, e.g. "greedy: 1 0.30->0.50, ..., all 0.41->0.56"."""
    parts = []
    for metric, levels in before.items():
        pairs = ", ".join(f"{level} {levels[level]:.2f}->{after[metric][level]:.2f}" for level in levels)
        parts.append(f"{metric}: {pairs}")
    return "; ".join(parts)


def main(recipe_args: RecipeArguments, training_args: GRPOHubConfig, model_args: ModelConfig) -> dict:
    """Train, save the model/adapter to `output_dir`, print and write the summary; return it."""
    # the offline model named like the task (chain, arithmetic), else the random tiny model
    model_name = model_args.model_name_or_path or OFFLINE_MODELS.get(recipe_args.task, build_tiny_model)()
    if (
        model_args.model_name_or_path
        and training_args.learning_rate
        == config_files.read_config(task_preset(recipe_args.task))["learning_rate"]
    ):
        logger.warning(
            "learning_rate=%s is the offline model's default; for a real model set --learning_rate (e.g. 1e-5) "
            "or start from recipes/configs/qwen2.5-0.5b-math.yaml",
            training_args.learning_rate,
        )
    model_init_kwargs = {"dtype": model_args.dtype, "attn_implementation": model_args.attn_implementation}
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs

    dataset = load_task_dataset(
        recipe_args.task,
        n=recipe_args.num_prompts,
        seed=recipe_args.dataset_seed,
        dataset_name=recipe_args.dataset_name,
        dataset_config=recipe_args.dataset_config,
        split=recipe_args.dataset_train_split,
    )
    history = RewardHistory()
    callbacks = [history]
    push = hub_push_callback(training_args, model_name) if training_args.push_to_hub else None
    callbacks += [push] if push else []
    lora_rank = model_args.lora_r if model_args.use_peft else None
    with local_vllm_server(recipe_args, training_args, model_name, lora_rank):
        use_cpu_cores(training_args)
        return train_and_report(
            recipe_args, training_args, model_args, model_name, dataset, callbacks, history, push
        )


def train_and_report(
    recipe_args, training_args, model_args, model_name, dataset, callbacks, history, push
) -> dict:
    """Build the trainer (a setting refused there is one line, exit 2), train, save, print and write the summary."""
    try:
        trainer = GRPOHubTrainer(
            model=model_name,
            reward_funcs=get_reward_funcs(recipe_args.task),
            args=training_args,
            train_dataset=dataset,
            peft_config=get_peft_config(model_args),
            callbacks=callbacks,
        )
    except NoMatchingPeftModuleError as error:  # the modules are known only once the model is loaded
        fail(
            field_message(
                "lora_target_modules",
                str(error).split(" Please")[0].rstrip(".") + ".",
                "name modules of the model.",
            )
        )
    except ValueError as error:
        if str(error).startswith("`"):  # grpo_hub's field error: "`field`: problem Fix: fix"
            fail(str(error))
        raise
    if not recipe_args.full_logs:
        use_compact_progress(trainer)
    scored = recipe_args.task in SCORED_TASKS
    before = heldout_accuracy(trainer, recipe_args) if scored else None
    start = time.perf_counter()
    train_output = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    wall_seconds = time.perf_counter() - start
    trainer.save_model(training_args.output_dir)

    summary = summarize(trainer, history, train_output, wall_seconds, model_name, recipe_args.task)
    if scored:
        summary["heldout_before"], summary["heldout_after"] = before, heldout_accuracy(trainer, recipe_args)
    if push and push.pushed:  # the final push: repo, branch and the commit it is pinned to
        summary["pushed"] = {k: getattr(push.pushed[-1], k) for k in ("repo_id", "revision", "commit_sha")}
    if trainer.accelerator.is_main_process:
        Path(training_args.output_dir, SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
    trainer.accelerator.print(
        f"GRPO done: {summary['steps']} steps on {summary['world_size']} process(es) in {summary['train_seconds']} s "
        f"({summary['wall_seconds']} s with engine set-up); "
        f"mean reward first {summary['reward_first']:.3f} -> last {summary['reward_last']:.3f}; "
        f"saved to {summary['saved_to']} (summary: {SUMMARY_FILE})"
    )
    if scored:
        trainer.accelerator.print(
            f"held-out accuracy before -> after (per level = {LEVEL_MEANING[recipe_args.task]}): "
            + accuracy_line(summary["heldout_before"], summary["heldout_after"])
        )
    if "pushed" in summary:
        pushed = summary["pushed"]
        trainer.accelerator.print(
            f"pushed to the Hub: {pushed['repo_id']}@{pushed['revision']} (commit {pushed['commit_sha'][:7]}); "
            f"compare it: grpo-hub compare --adapters {pushed['repo_id']}@{pushed['revision']}"
        )
    trainer.end()
    return summary


if __name__ == "__main__":
    quiet_upstream_warnings()
    if (
        not sys.stdout.isatty()
    ):  # a log file: one line per step and no tqdm redraws (grpo_hub.records.console)
        plain_upstream_bars()
    recipe_args, training_args, model_args = make_parser().parse_args_and_config()
    main(recipe_args, training_args, model_args)
