"""Built-in tasks: prompts made in code (offline) and graded reward functions for TRL's GRPOTrainer.

```python
from grpo_hub.tasks import DEFAULT_TASK, build_tiny_model, get_reward_funcs, load_task_dataset
path = build_tiny_model()                          # offline random-init Qwen2 + BPE tokenizer
ds = load_task_dataset(DEFAULT_TASK, n=64, seed=0)  # Dataset with a plain-text "prompt" column
reward_funcs = get_reward_funcs(DEFAULT_TASK)       # TRL reward callables
```

Tasks
- `"chain"` (default): "37+5*3-4=" as a chat message, answered with a scratchpad ("37+5=42,42*3=126,126-4=122")
  -> `chain_correctness_reward` (the final integer); 2,000 held-out problems (`grpo_hub.tasks.chain`). Its
  model is the shipped `chain_model_path()`, its settings recipes/configs/chain.yaml (the recipe's main job).
- `"digits"`: "Write only digits: 4 1 7" -> reward = fraction of non-whitespace completion
  characters that are digits. Graded in [0, 1]; a random model scores ~0.18. A smoke task: the random tiny
  model learns to print digits (a reward hack, nothing to generalise); settings recipes/configs/grpo.yaml.
- `"digits_or_letters"`: "Write only digits:" or "Write only letters:" -> reward = fraction of characters
  of the asked kind. The model must read the prompt; full fine-tuning learns it, LoRA much more slowly.
- `"arithmetic"`: "37+5=" as a chat message -> `arithmetic_correctness_reward` (exact integer) +
  `arithmetic_format_reward` (0.1 for a bare integer); train rows carry `answer` and `level`, a fixed
  held-out split never overlaps them (`grpo_hub.tasks.arithmetic`). Its model is `build_arithmetic_model`.
- `"gsm8k"`: a GSM8K-style dataset the user names (`dataset_name=` a Hub id or local path, columns
  question/answer; needs the `math` extra) -> `math_correctness_reward` (math_verify) +
  `answer_format_reward`.

Measured on 2 shared CPU cores with plain `trl.GRPOTrainer` and the settings of recipes/configs/grpo.yaml
(num_generations 4, batch 16, 16 completion tokens, beta 0, ~0.3-0.5 s/step), mean reward of the first
5 vs the last 5 of 30 steps:
- digits, LoRA r16/alpha32 all-linear, lr 3e-2: 0.17 -> 1.00
- digits, full fine-tuning, lr 1e-2: 0.18 -> 0.65
- digits_or_letters, full fine-tuning, lr 1e-2, 40 steps: 0.39 -> 0.99 (LoRA lr 3e-2: 0.40 -> 0.39)
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable, Sequence

from grpo_hub.tasks.arithmetic import arithmetic_correctness_reward, arithmetic_format_reward, load_arithmetic
from grpo_hub.tasks.chain import chain_correctness_reward, chain_step_reward, load_chain
from grpo_hub.tasks.text import completion_text
from grpo_hub.tasks.tiny_model import build_tiny_model

DEFAULT_TASK = "chain"
SMOKE_TASK = "digits"  # the random tiny model's task: learns in seconds (tests, benchmarks of the plumbing)
OFFLINE_TASKS = ("chain", "digits", "digits_or_letters", "arithmetic")
TASKS = (*OFFLINE_TASKS, "gsm8k")
# Reward functions a run can add to a task's own by name (the recipe's `reward_funcs`): they read its rows' columns
OPTIONAL_REWARDS = {"chain": (chain_step_reward,)}
GSM8K_SYSTEM = "Solve the problem. Think step by step, then give the final answer inside \\boxed{}."

__all__ = [
    "DEFAULT_TASK",
    "OPTIONAL_REWARDS",
    "SMOKE_TASK",
    "TASKS",
    "answer_format_reward",
    "build_tiny_model",
    "digit_fraction_reward",
    "get_reward_funcs",
    "kind_fraction_reward",
    "load_task_dataset",
    "math_correctness_reward",
]


def _check_task(task: str) -> None:
    """Raise a ValueError naming the valid task names when `task` is unknown."""
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}: choose one of {', '.join(TASKS)}")


def _visible_chars(text: str) -> str:
    """`text` with all whitespace removed."""
    return "".join(text.split())


def kind_prompts(n: int, seed: int) -> list[dict]:
    """`n` rows {"prompt": "Write only letters:", "kind": "letters"}, kind drawn from `seed` (digits/letters)."""
    rng = random.Random(seed)
    kinds = [rng.choice(("digits", "letters")) for _ in range(n)]
    return [{"prompt": f"Write only {kind}:", "kind": kind} for kind in kinds]


def digit_prompts(n: int, seed: int) -> list[dict]:
    """`n` rows {"prompt": "Write only digits: 4 1 7"} with example digits drawn from `seed`."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        example = " ".join(rng.choice(string.digits) for _ in range(rng.randint(1, 4)))
        rows.append({"prompt": f"Write only digits: {example}"})
    return rows


def digit_fraction_reward(prompts, completions, **kwargs) -> list[float]:
    """Reward = (#digit chars) / (#non-whitespace chars) of each completion; 0 if empty."""
    rewards = []
    for completion in completions:
        chars = _visible_chars(completion_text(completion))
        rewards.append(sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0)
    return rewards


def kind_fraction_reward(prompts, completions, kind, **kwargs) -> list[float]:
    """Reward = fraction of non-whitespace chars of the row's `kind` ("digits" or "letters"); 0 if empty."""
    rewards = []
    for completion, wanted in zip(completions, kind, strict=True):
        if wanted not in ("digits", "letters"):
            raise ValueError(
                f"kind_fraction_reward: column `kind` must be 'digits' or 'letters', got {wanted!r}"
            )
        matches = str.isdigit if wanted == "digits" else str.isalpha
        chars = _visible_chars(completion_text(completion))
        rewards.append(sum(matches(c) for c in chars) / len(chars) if chars else 0.0)
    return rewards


_BOXED = re.compile(r"\\boxed\{[^{}]+\}")


def answer_format_reward(prompts, completions, **kwargs) -> list[float]:
    """Reward 1.0 when the completion holds exactly one `\\boxed{...}` answer, else 0.0."""
    return [float(len(_BOXED.findall(completion_text(c))) == 1) for c in completions]


def gsm8k_gold(answer: str) -> str:
    """Final number of a GSM8K `answer` field (text after '####', commas removed)."""
    if "####" not in answer:
        raise ValueError(f"gsm8k answer has no '####' final-answer marker: {answer[:80]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


def math_correctness_reward(prompts, completions, solution, **kwargs) -> list[float]:
    """Reward 1.0 when math_verify judges the completion's final answer equal to `solution`, else 0.0.

    Both sides go through `math_verify.parse`; an unparsable gold answer raises (bad data), an
    unparsable completion scores 0.
    """
    from math_verify import parse, verify

    rewards = []
    for completion, gold_text in zip(completions, solution, strict=True):
        gold = parse(f"${gold_text}$")
        if not gold:
            raise ValueError(f"math_correctness_reward: cannot parse gold solution {gold_text!r}")
        answer = parse(completion_text(completion))
        rewards.append(float(bool(answer) and verify(gold, answer)))
    return rewards


def _load_gsm8k(n: int, seed: int, dataset_name: str | None, dataset_config: str | None, split: str):
    """Load a GSM8K-style dataset (columns question/answer) into prompt + solution rows."""
    if not dataset_name:
        raise ValueError(
            "task 'gsm8k' needs `dataset_name` (a Hub id such as 'openai/gsm8k' with dataset_config 'main', "
            "or a local path); the offline tasks are: " + ", ".join(OFFLINE_TASKS)
        )
    from datasets import load_dataset

    raw = load_dataset(dataset_name, dataset_config, split=split)
    missing = {"question", "answer"} - set(raw.column_names)
    if missing:
        raise ValueError(f"dataset {dataset_name!r} lacks column(s) {sorted(missing)} needed by task 'gsm8k'")
    raw = raw.shuffle(seed=seed).select(range(min(n, len(raw))))
    return raw.map(
        lambda row: {
            "prompt": [
                {"role": "system", "content": GSM8K_SYSTEM},
                {"role": "user", "content": row["question"]},
            ],
            "solution": gsm8k_gold(row["answer"]),
        },
        remove_columns=raw.column_names,
    )


def load_task_dataset(
    task: str = DEFAULT_TASK,
    n: int = 64,
    seed: int = 0,
    *,
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    split: str = "train",
):
    """Return a `datasets.Dataset` of `n` rows for `task`, deterministic in `seed`.

    "chain" and "arithmetic" have conversational prompts + "answer" and "level" (their "train" split);
    "digits" and "digits_or_letters" have a plain-text "prompt" column plus whatever their rewards read
    ("kind").
    "gsm8k" loads `dataset_name` (Hub id or local path) and gives conversational prompts + "solution".
    """
    from datasets import Dataset

    _check_task(task)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"load_task_dataset: `n` must be a positive int, got {n!r}")
    if task == "gsm8k":
        return _load_gsm8k(n, seed, dataset_name, dataset_config, split)
    if dataset_name:
        raise ValueError(f"task {task!r} is generated offline; drop `dataset_name` or use task 'gsm8k'")
    if task == "arithmetic":
        return load_arithmetic("train", n, seed)
    if task == "chain":
        return load_chain("train", n, seed)
    rows = digit_prompts(n, seed) if task == "digits" else kind_prompts(n, seed)
    return Dataset.from_list(rows)


def get_reward_funcs(task: str = DEFAULT_TASK, names: Sequence[str] | None = None) -> list[Callable]:
    """TRL reward callables for `task` (each `(prompts, completions, **kwargs) -> list[float]`): its own, or, given
    `names`, those named, in that order, from its own and its `OPTIONAL_REWARDS`. ValueError on an empty list or an
    unknown or repeated name."""
    _check_task(task)
    own = {
        "chain": [chain_correctness_reward],
        "digits": [digit_fraction_reward],
        "digits_or_letters": [kind_fraction_reward],
        "arithmetic": [arithmetic_correctness_reward, arithmetic_format_reward],
        "gsm8k": [math_correctness_reward, answer_format_reward],
    }[task]
    if names is None:
        return own
    offered = {fn.__name__: fn for fn in (*own, *OPTIONAL_REWARDS.get(task, ()))}
    unknown = [name for name in names if name not in offered]
    repeated = sorted({name for name in names if list(names).count(name) > 1})
    if not names or unknown or repeated:
        problem = f"unknown {unknown}" if unknown else f"repeated {repeated}" if repeated else "none named"
        raise ValueError(f"reward functions for task {task!r}: {problem}; choose from {', '.join(offered)}")
    return [offered[name] for name in names]
