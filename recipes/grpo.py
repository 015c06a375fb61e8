"""GRPO recipe: `GRPOHubTrainer` on a built-in task, following `trl/scripts/grpo.py`. It reads top to bottom: parse
(`make_parser`), build the task and model, train, report (`main`).

    accelerate launch recipes/grpo.py                                         # the chain task, ~5 min on 2 CPU cores
    accelerate launch recipes/grpo.py --task digits                           # smoke task on the random tiny model, ~30 s
    accelerate launch recipes/grpo.py --config recipes/configs/gspo.yaml      # any preset
    accelerate launch --config_file recipes/accelerate/cpu-ddp.yaml recipes/grpo.py   # 2 CPU ranks

Defaults: a task's preset (chain: recipes/configs/chain.yaml, a LoRA adapter on the shipped chain model; any other
task: recipes/configs/grpo.yaml on the random tiny model), fit for the offline models only: for a real model start
from recipes/configs/qwen2.5-0.5b-math.yaml. Every `GRPOHubConfig`, `ModelConfig` and `RecipeArguments` field is a
flag or a YAML key (`--config`). The end-of-run summary (`grpo_hub.records.run_summary`) is printed and written to
`<output_dir>/run_summary.json`, with held-out accuracy before -> after for "chain" and "arithmetic". docs/recipes.md
has the full account.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from accelerate import PartialState
from peft.utils.error import NoMatchingPeftModuleError
from trl import ModelConfig, get_peft_config
from trl.models import unwrap_model_for_generation

from grpo_hub import GRPOHubConfig, GRPOHubTrainer
from grpo_hub.config import config_files, recipe_parser, value_ranges
from grpo_hub.config.cpu_threads import use_cpu_cores
from grpo_hub.config.recipe_parser import RecipeParser, fail
from grpo_hub.errors import field_message
from grpo_hub.generation import server_process
from grpo_hub.hub import HubPushCallback
from grpo_hub.records import run_summary
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
LEVEL_MEANING = {"chain": "steps in the chain", "arithmetic": "digits of the first operand"}
PRESETS = Path(__file__).resolve().parent / "configs"
TASK_PRESETS = {"chain": "chain.yaml"}  # a task's defaults, written out; any other task runs SMOKE_PRESET's
SMOKE_PRESET = "grpo.yaml"  # the random tiny model's settings
# eval_per_level's bound: the held-out problems per level of each scored task
HELDOUT_PER_LEVEL = {task: module.HELDOUT_PER_LEVEL for task, module in SCORED_TASKS.items()}


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
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions to train on, by name, instead of the task's own: from the task's own and "
            "its optional ones (chain: chain_step_reward, partial credit per right scratchpad step). "
            "--reward_weights weighs them in this order."
        },
    )
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
    eval_per_level: int | None = field(
        default=None,
        metadata={
            "help": "For tasks 'chain' and 'arithmetic': held-out problems per level evaluated before and after "
            "training (default: the task's whole held-out set, 500 per level for chain, 50 for arithmetic). Fewer "
            "is faster and noisier."
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
        # ranges (value_ranges.RECIPE_RANGES) and the flags' dependencies
        recipe_parser.check_recipe_arguments(self, HELDOUT_PER_LEVEL)


def task_preset(task: str) -> Path:
    """The YAML whose settings are the recipe's defaults for `task` run on its offline model."""
    return PRESETS / TASK_PRESETS.get(task, SMOKE_PRESET)


def check_parsed(recipe_args: RecipeArguments, training_args: GRPOHubConfig, model_args: ModelConfig) -> None:
    """What the values alone decide across the three dataclasses, before a model or dataset is loaded."""
    value_ranges.check_recipe_settings(recipe_args, model_args)
    recipe_parser.check_reward_choice(recipe_args, training_args.reward_weights, get_reward_funcs)


def make_parser(argv: list[str] | None = None) -> RecipeParser:
    """The parser of (RecipeArguments, GRPOHubConfig, ModelConfig), its defaults the preset of the task `argv`
    names (`task_preset`) on this machine's device; a YAML `--config` and the flags override them."""
    parser = RecipeParser((RecipeArguments, GRPOHubConfig, ModelConfig), check_parsed)
    task = recipe_parser.requested_task(sys.argv[1:] if argv is None else argv, TASKS, DEFAULT_TASK)
    has_cuda = torch.cuda.is_available()
    parser.set_defaults(**config_files.read_config(task_preset(task)), use_cpu=not has_cuda, bf16=has_cuda)
    return parser


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
    cores = recipe_args.vllm_server_cores
    if cores is not None:
        rest = set(os.sched_getaffinity(0)) - server_process.parse_cores(cores)
        if not rest:
            fail(
                f"--vllm_server_cores {cores}: no core is left for training. Fix: give the server fewer cores."
            )
        os.sched_setaffinity(0, rest)
        torch.set_num_threads(len(rest))
    if not PartialState().is_local_main_process:
        yield
        return
    with server_process.local_server(
        model_name, port=training_args.vllm_server_port, lora_rank=lora_rank, sync=training_args.vllm_server_sync,
        dtype="bfloat16" if training_args.bf16 else "float32",  # what the trainer computes in
        cores=cores, gpus=recipe_args.vllm_server_gpus, log=Path(training_args.output_dir, "vllm-server.log"),
        timeout=training_args.vllm_server_timeout,
    ):  # fmt: skip
        yield


def heldout_accuracy(trainer, recipe_args: RecipeArguments) -> dict:
    """Held-out accuracy per level of the model being trained (every rank generates: ZeRO-3 needs all)."""
    extra = {"pass_k": recipe_args.eval_pass_k} if recipe_args.eval_pass_k else {}
    extra |= {"n": recipe_args.eval_per_level} if recipe_args.eval_per_level else {}
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        return SCORED_TASKS[recipe_args.task].evaluate(model, trainer.processing_class, "heldout", **extra)


def main(recipe_args: RecipeArguments, training_args: GRPOHubConfig, model_args: ModelConfig) -> dict:
    """Train, save the model/adapter to `output_dir`, print and write the summary; return it."""
    # the offline model named like the task (chain, arithmetic), else the random tiny model
    model_name = model_args.model_name_or_path or OFFLINE_MODELS.get(recipe_args.task, build_tiny_model)()
    preset_learning_rate = config_files.read_config(task_preset(recipe_args.task))["learning_rate"]
    if model_args.model_name_or_path and training_args.learning_rate == preset_learning_rate:
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
    history = run_summary.RewardHistory()
    callbacks = [history]
    push = HubPushCallback.for_run(training_args, model_name) if training_args.push_to_hub else None
    callbacks += [push] if push else []
    lora_rank = model_args.lora_r if model_args.use_peft else None
    with local_vllm_server(recipe_args, training_args, model_name, lora_rank):
        use_cpu_cores(training_args.device.type)
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
            reward_funcs=get_reward_funcs(recipe_args.task, recipe_args.reward_funcs),
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

    summary = run_summary.summarize(
        trainer, history, train_output, wall_seconds, model_name, recipe_args.task
    )
    if scored:
        summary["heldout_before"], summary["heldout_after"] = before, heldout_accuracy(trainer, recipe_args)
        if recipe_args.eval_per_level:
            summary["heldout_per_level"] = recipe_args.eval_per_level
    if push and push.pushed:  # the final push: repo, branch and the commit it is pinned to
        summary["pushed"] = {k: getattr(push.pushed[-1], k) for k in ("repo_id", "revision", "commit_sha")}
    if trainer.accelerator.is_main_process:
        run_summary.write_summary(training_args.output_dir, summary)
    for line in run_summary.summary_lines(summary, LEVEL_MEANING.get(recipe_args.task)):
        trainer.accelerator.print(line)
    trainer.end()
    return summary


if __name__ == "__main__":
    quiet_upstream_warnings()
    if not sys.stdout.isatty():  # a log file: a line per step, no tqdm redraws (grpo_hub.records.console)
        plain_upstream_bars()
    recipe_args, training_args, model_args = make_parser().parse_args_and_config()
    main(recipe_args, training_args, model_args)
