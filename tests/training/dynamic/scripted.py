"""Scripted rollouts for the tool task: replaces `GRPOTrainer._generate_single_turn` with fixed completions.

The tiny random model almost never writes a valid tool call, so the multi-turn tests drive TRL's real tool
loop (`_tool_call_loop`: tool execution, tool_mask, re-generation) with completions chosen by each row's
position in its group:
  0 "right":        calls add(a, b), then states a + b         turn rewards [1, 1], outcome 1
  1 "wrong-answer": calls add(a, b), then states a + b + 1     turn rewards [1, 0], outcome 0
  2 "wrong-call":   calls add(a, b + 1), then states a + b + 1 turn rewards [0, 0], outcome 0
  3 "direct":       states a + b without a tool call           turn rewards [1],    outcome 1
"""

from __future__ import annotations

import re

from transformers import AutoModelForCausalLM

from grpo_hub.tasks.tool_task import (
    add,
    answer_reward,
    load_tool_dataset,
    tool_call_text,
    tool_call_turn_reward,
    tool_tokenizer,
)
from grpo_hub.training.trainer import GRPOHubTrainer
from tests.helpers import tiny_config

PLANS = ("right", "wrong-answer", "wrong-call", "direct")
TURN_REWARDS = ([1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0])
OUTCOMES = (1.0, 0.0, 0.0, 1.0)
_QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


class ScriptedRollouts:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.pending: list[tuple[int, int, str]] = []  # rows that called the tool, in TRL's order

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text + self.tokenizer.eos_token, add_special_tokens=False)

    def __call__(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = [self.tokenizer.decode(ids) for ids in prompt_ids]
        if any("<tool_response>" in text for text in texts):  # the tool loop's second turn
            answers = []
            for _ in texts:
                a, b, plan = self.pending.pop(0)
                answers.append(f"The answer is {a + b if plan == 'right' else a + b + 1}")
            return [self._ids(text) for text in answers], None
        self.pending, completions = [], []
        for row, text in enumerate(texts):
            a, b = (int(x) for x in _QUESTION.findall(text)[-1])
            plan = PLANS[row % len(PLANS)]
            if plan == "direct":
                completions.append(f"The answer is {a + b}")
                continue
            completions.append(tool_call_text(a, b + (plan == "wrong-call")))
            self.pending.append((a, b, plan))
        return [self._ids(text) for text in completions], None


def tool_trainer(tmp_path, model_dir, **overrides):
    """A GRPOHubTrainer on the tool task (turn-level ratios and advantages unless `overrides` say otherwise) whose
    generation is `ScriptedRollouts`."""
    settings = {
        "max_completion_length": 200,
        "shuffle_dataset": False,
        "loss_type": "grpo",
        "importance_sampling_level": "turn",
        "turn_advantages": "turn",
        **overrides,
    }
    tokenizer = tool_tokenizer(model_dir)
    trainer = GRPOHubTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=[tool_call_turn_reward, answer_reward],
        tools=[add],
        train_dataset=load_tool_dataset(32),
        processing_class=tokenizer,
        args=tiny_config(tmp_path, **settings),
    )
    trainer._generate_single_turn = ScriptedRollouts(trainer.processing_class)
    return trainer
