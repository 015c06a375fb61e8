"""Offline *pretrained* model for the arithmetic task: a tiny Qwen2 taught some arithmetic, partly.

`build_arithmetic_model()` makes a character-level tokenizer (a byte-level BPE with no merges, so every
digit is its own token), initialises a small `Qwen2ForCausalLM` and trains it with plain supervised
next-token loss on synthetic problems (`grpo_hub.tasks.arithmetic`, never a held-out one) for a fixed
budget, single-threaded and with deterministic algorithms, then saves model + tokenizer (with the chat
template) to a cached folder keyed by a fingerprint of this recipe (`grpo_hub.tasks.model_cache`).

The budget is short, so the model is stopped partly right on every level (greedy ~0.4-0.6), where
sampling finds the right answer much more often than greedy decoding does (pass@8 ~0.6-0.8). That is the
room GRPO uses. Measured numbers are in docs/tasks.md.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from grpo_hub.tasks.arithmetic import CHAT_TEMPLATE, LEVELS, chat_prompt, heldout_problems, make_problem
from grpo_hub.tasks.model_cache import cached_build, check_seed, fingerprint, save_model
from grpo_hub.tasks.tiny_model import SPECIAL_TOKENS, byte_level_tokenizer, init_model

BUILD_VERSION = "2"  # bump when the build changes in a way the recipe below does not show
MODEL_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 64,
}
SFT_RECIPE = {
    "steps": 1500,
    "batch_size": 64,
    "learning_rate": 3e-3,
    "warmup_steps": 50,
    "level_weights": [1, 1, 1, 1],  # share of LEVELS in the SFT data
    "grad_clip": 1.0,
}


def build_recipe(seed: int, sft: dict) -> dict:
    """Everything that shapes the weights (the fingerprint's input)."""
    return {
        "version": BUILD_VERSION,
        "specials": SPECIAL_TOKENS,
        "chat_template": CHAT_TEMPLATE,
        "shape": MODEL_SHAPE,
        "sft": sft,
        "heldout": [p.question for p in heldout_problems()],
        "seed": seed,
    }


def char_tokenizer():
    """Byte-level BPE without merges (259 tokens: 256 bytes + specials) with the chat template."""
    from tokenizers import pre_tokenizers

    return byte_level_tokenizer(
        len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIAL_TOKENS),
        [],
        CHAT_TEMPLATE,
        MODEL_SHAPE["max_position_embeddings"],
    )


class ProblemEncoder:
    """Token ids of (chat prompt, answer + EOS) without running the chat template for every problem."""

    def __init__(self, tokenizer):
        marker = "@"
        text = tokenizer.apply_chat_template(chat_prompt(marker), tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text)["input_ids"]
        cut = ids.index(tokenizer.convert_tokens_to_ids(marker))
        self.head, self.tail = ids[:cut], ids[cut + 1 :]
        self.tokenizer = tokenizer

    def __call__(self, question: str, answer: str) -> tuple[list[int], list[int]]:
        chars = self.tokenizer.convert_tokens_to_ids
        return self.head + chars(list(question)) + self.tail, chars(list(answer)) + [
            self.tokenizer.eos_token_id
        ]


def collate(rows: list[tuple[list[int], list[int]]], pad: int):
    """(input_ids, attention_mask, labels) of (prompt ids, completion ids) rows, left-padded, loss on completions."""
    import torch

    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (prompt, completion) in enumerate(rows):
        length = len(prompt) + len(completion)
        ids[i, width - length :] = torch.tensor(prompt + completion)
        mask[i, width - length :] = 1
        labels[i, width - len(completion) :] = torch.tensor(completion)
    return ids, mask, labels


def problem_batches(encoder: ProblemEncoder, draw, skip: set[str], batch_size: int):
    """Endless collated batches of `batch_size` (question, target) pairs from `draw()`, skipping the questions in
    `skip` (the held-out set); shared by the offline models' SFT builds."""
    while True:
        rows = []
        while len(rows) < batch_size:
            question, target = draw()
            if question not in skip:
                rows.append(encoder(question, target))
        yield collate(rows, encoder.tokenizer.pad_token_id)


def sft_batches(encoder: ProblemEncoder, seed: int, sft: dict):
    """Endless (input_ids, attention_mask, labels) batches of problems (question -> answer), never a held-out one."""
    rng = random.Random(f"arithmetic-sft-{seed}")

    def draw() -> tuple[str, str]:
        problem = make_problem(rng, rng.choices(LEVELS, weights=sft["level_weights"])[0])
        return problem.question, problem.answer

    return problem_batches(encoder, draw, {p.question for p in heldout_problems()}, sft["batch_size"])


def supervised_train(model, batches, seed: int, sft: dict, observe=None) -> None:
    """AdamW on next-token loss for `sft["steps"]` of `batches`, linear warm-up, one thread, deterministic.

    `observe(step, model)`, if given, is called before the first step (step 0) and after every optimizer step."""
    import torch

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=sft["learning_rate"], weight_decay=0.0)
        warmup = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / sft["warmup_steps"])
        )
        model.train()
        if observe:
            observe(0, model)
        for step in range(1, sft["steps"] + 1):
            ids, mask, labels = next(batches)
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), sft["grad_clip"])
            optimizer.step()
            warmup.step()
            optimizer.zero_grad(set_to_none=True)
            if observe:
                observe(step, model)
        model.eval()
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _write_model(folder: Path, seed: int, sft: dict) -> None:
    """Tokenizer + supervised-trained model into `folder`."""
    tokenizer = char_tokenizer()
    model = init_model(tokenizer, seed, shape=MODEL_SHAPE)
    supervised_train(model, sft_batches(ProblemEncoder(tokenizer), seed, sft), seed, sft)
    save_model(folder, model, tokenizer)


def build_arithmetic_model(
    output_dir: str | os.PathLike | None = None, seed: int = 0, sft: dict | None = None
) -> str:
    """Return a local folder holding the arithmetic model + tokenizer, training it on first use.

    Default folder: `<cache>/arithmetic-qwen2-seed<seed>-<fingerprint>`. `sft` overrides `SFT_RECIPE`
    entries (e.g. a few steps in tests); the fingerprint covers them.
    """
    check_seed(seed, "build_arithmetic_model")
    sft = {**SFT_RECIPE, **(sft or {})}
    unknown = set(sft) - set(SFT_RECIPE)
    if unknown:
        raise ValueError(f"build_arithmetic_model: unknown sft setting(s) {sorted(unknown)}")
    name = f"arithmetic-qwen2-seed{seed}-{fingerprint(build_recipe(seed, sft))}"
    return cached_build(
        output_dir, name, lambda folder: _write_model(folder, seed, sft), "build_arithmetic_model"
    )
