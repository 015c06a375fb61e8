"""A tiny offline multi-turn tool task: "What is 3 + 4?" with an `add(a, b)` tool.

```python
from grpo_hub.tasks.tool_task import add, load_tool_dataset, tool_tokenizer, tool_call_turn_reward, answer_reward
trainer = GRPOHubTrainer(model, reward_funcs=[tool_call_turn_reward, answer_reward], tools=[add],
                         train_dataset=load_tool_dataset(32), processing_class=tool_tokenizer(model_dir), args=...)
```

The rollout the task rewards: turn 1 calls `add` with the two numbers of the question, TRL runs the tool and
appends its result, turn 2 states the sum. `tool_tokenizer` gives the tiny model's tokenizer a compact
Qwen-style chat template (Qwen2.5's full template renders the tool schema as ~700 tokens of the 512-entry
BPE, more than the tiny model's 512 positions) and TRL's Qwen3 response parser for `<tool_call>` JSON blocks
(`trl.chat_template_utils.qwen3_template`). The tiny random model almost never writes a valid tool call, so
tests drive the tool loop with scripted completions.
"""

from __future__ import annotations

import json
import random
import re

from grpo_hub.training.turns import per_turn_reward

SYSTEM = "Use the add tool to add numbers, then give the answer."
_NUMBER = re.compile(r"-?\d+")


def add(a: int, b: int) -> int:
    """
    Add two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum a + b.
    """
    return a + b


def load_tool_dataset(n: int = 32, seed: int = 0):
    """`n` conversational prompts "What is a + b?" with the operands in columns `a` and `b`."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        prompt = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {a} + {b}?"}]
        rows.append({"prompt": prompt, "a": a, "b": b})
    return Dataset.from_list(rows)


TOOL_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for tool in tools %} {{ tool.function.name }}{% endfor %}. "
    'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\n{% endif %}'
    "{% for message in messages %}"
    "{% if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls %}<tool_call>\n"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}\n</tool_call>{% endfor %}"
    "<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tool_tokenizer(model_dir: str):
    """The tiny model's tokenizer with `TOOL_CHAT_TEMPLATE` and TRL's Qwen3 `<tool_call>` response parser."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_template

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = qwen3_template
    return tokenizer


def tool_call_text(a: int, b: int) -> str:
    """An assistant message calling `add(a, b)` in the Qwen2.5 format."""
    return f"<tool_call>\n{json.dumps({'name': 'add', 'arguments': {'a': a, 'b': b}})}\n</tool_call>"


def _assistant_messages(completion) -> list[dict]:
    return [message for message in completion if message.get("role") == "assistant"]


def _calls_add(message: dict, a: int, b: int) -> bool:
    calls = message.get("tool_calls") or []
    return any(
        call.get("function", {}).get("name") == "add"
        and call["function"].get("arguments") == {"a": a, "b": b}
        for call in calls
    )


def _states(message: dict, value: int) -> bool:
    return not message.get("tool_calls") and str(value) in _NUMBER.findall(message.get("content") or "")


@per_turn_reward
def tool_call_turn_reward(prompts, completions, a, b, **kwargs) -> list[list[float]]:
    """Per turn: 1.0 for a tool call `add(a, b)` with the question's numbers, or for a message stating a + b."""
    return [
        [float(_calls_add(m, x, y) or _states(m, x + y)) for m in _assistant_messages(completion)]
        for completion, x, y in zip(completions, a, b, strict=True)
    ]


def answer_reward(prompts, completions, a, b, **kwargs) -> list[float]:
    """Outcome: 1.0 when the last assistant message states a + b, else 0.0."""
    rewards = []
    for completion, x, y in zip(completions, a, b, strict=True):
        messages = _assistant_messages(completion)
        rewards.append(float(bool(messages) and _states(messages[-1], x + y)))
    return rewards
