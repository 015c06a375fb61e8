"""Built-in tasks and their tiny models, made offline: prompts, reward functions, a tool task, gym GRPO.

```python
from grpo_hub.tasks import SMOKE_TASK, build_tiny_model, get_reward_funcs, load_task_dataset
```
`builtin` (the recipe's tasks), `chain` (the default reasoning task: multi-step arithmetic with a scratchpad,
2,000 held-out problems), `chain_model` (its shipped pretrained model, reproducible by its build),
`arithmetic` (the one-step arithmetic task: splits, rewards, `evaluate`),
`tiny_model` (offline random Qwen2 + BPE tokenizer), `arithmetic_model` (offline Qwen2 taught some arithmetic),
`model_cache` (their cached, race-safe builds), `tool_task` (multi-turn tool calls), `gym` (GRPO on
classic-control environments, needs the `gym` extra).
"""

from grpo_hub.tasks import arithmetic, chain
from grpo_hub.tasks.arithmetic_model import build_arithmetic_model
from grpo_hub.tasks.builtin import (
    DEFAULT_TASK,
    OFFLINE_TASKS,
    OPTIONAL_REWARDS,
    SMOKE_TASK,
    TASKS,
    answer_format_reward,
    digit_fraction_reward,
    get_reward_funcs,
    gsm8k_gold,
    kind_fraction_reward,
    load_task_dataset,
    math_correctness_reward,
)
from grpo_hub.tasks.chain_model import chain_model_path
from grpo_hub.tasks.tiny_model import build_tiny_model

# The offline base models by name (`grpo-hub compare --base-model arithmetic`): each builds or finds its folder.
OFFLINE_MODELS = {"chain": chain_model_path, "arithmetic": build_arithmetic_model, "tiny": build_tiny_model}
# Tasks with a held-out split, `evaluate` and right/wrong answers (`heldout_problems`, the final integer): the
# recipe reports their held-out accuracy, the Space marks their answers (chain first: the default task).
SCORED_TASKS = {"chain": chain, "arithmetic": arithmetic}
DEFAULT_COMPARE_BASE = "chain"  # the Space shows the model of the recipe's default task by default

__all__ = [
    "DEFAULT_COMPARE_BASE",
    "OFFLINE_MODELS",
    "DEFAULT_TASK",
    "OFFLINE_TASKS",
    "OPTIONAL_REWARDS",
    "SCORED_TASKS",
    "SMOKE_TASK",
    "TASKS",
    "answer_format_reward",
    "arithmetic",
    "build_arithmetic_model",
    "build_tiny_model",
    "chain",
    "chain_model_path",
    "digit_fraction_reward",
    "get_reward_funcs",
    "gsm8k_gold",
    "kind_fraction_reward",
    "load_task_dataset",
    "math_correctness_reward",
]
