"""Offline tiny model: a randomly initialised Qwen2-style causal LM with its own byte-level BPE tokenizer.

Nothing is downloaded. `build_tiny_model()` trains a 512-entry byte-level BPE on a corpus generated in
code, initialises a `Qwen2ForCausalLM` from a seed and saves both to a local folder that
`AutoTokenizer.from_pretrained` and `AutoModelForCausalLM.from_pretrained` load. The folder is cached
(`$GRPO_HUB_CACHE` or `~/.cache/grpo_hub`), identical for the same seed, and built once per machine however many
processes ask for it (`grpo_hub.tasks.model_cache`).

Shape: hidden 64, 2 heads of dim 32 (vLLM needs head dim >= 32), 1 KV head, 2 layers, ~0.1 M parameters.
Weights are drawn with std 0.3 (not Qwen's 0.02): with tied embeddings that small, logits are nearly flat
and a LoRA adapter (which leaves the embeddings frozen) barely moves them; at 0.3 LoRA learns the
built-in task in ~30 GRPO steps (measured in `grpo_hub.tasks`).
"""

from __future__ import annotations

import os
import random
import string
from pathlib import Path

from grpo_hub.tasks.model_cache import cached_build, check_seed, fingerprint, save_model

BUILD_VERSION = "2"  # bump when the build changes in a way the fingerprint does not see
VOCAB_SIZE = 512
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", EOS_TOKEN]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODEL_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "initializer_range": 0.3,
}


def build_fingerprint(seed: int) -> str:
    """Short hash of everything that shapes the build, so a changed recipe never reuses a stale cache."""
    recipe = {
        "version": BUILD_VERSION,
        "vocab": VOCAB_SIZE,
        "specials": SPECIAL_TOKENS,
        "chat_template": CHAT_TEMPLATE,
        "shape": MODEL_SHAPE,
        "corpus": tokenizer_corpus(seed),
        "seed": seed,
    }
    return fingerprint(recipe)


def tokenizer_corpus(seed: int = 0, n_lines: int = 400) -> list[str]:
    """Deterministic training text for the BPE: English-ish prompt words, letters, digits and numbers."""
    rng = random.Random(seed)
    words = [
        "write",
        "the",
        "letter",
        "only",
        "digits",
        "number",
        "answer",
        "repeat",
        "copy",
        "count",
        "say",
        "many",
        "times",
        "please",
        "a",
        "an",
        "of",
    ]
    lines = [string.ascii_letters, string.digits, string.punctuation]
    for _ in range(n_lines):
        parts = [rng.choice(words) for _ in range(rng.randint(3, 8))]
        parts.append(rng.choice(string.ascii_lowercase) * rng.randint(1, 6))
        parts.append(str(rng.randint(0, 10_000)))
        rng.shuffle(parts)
        lines.append(" ".join(parts) + rng.choice([":", ".", "?", "!"]))
    return lines


def byte_level_tokenizer(vocab_size: int, corpus, chat_template: str, max_length: int):
    """A byte-level BPE trained on `corpus` up to `vocab_size` (specials first), wrapped as a fast HF tokenizer
    with `chat_template` (shared by every offline model of `grpo_hub.tasks`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=chat_template,
        model_max_length=max_length,
    )


def train_tokenizer(seed: int = 0):
    """Train the byte-level BPE (vocab `VOCAB_SIZE`, specials first) and wrap it as a fast HF tokenizer."""
    return byte_level_tokenizer(
        VOCAB_SIZE, tokenizer_corpus(seed), CHAT_TEMPLATE, MODEL_SHAPE["max_position_embeddings"]
    )


def init_model(tokenizer, seed: int = 0, shape: dict | None = None):
    """Randomly initialise a `Qwen2ForCausalLM` of `shape` (default `MODEL_SHAPE`) from `seed`, with tied
    embeddings and the tokenizer's special tokens (shared by every offline model of `grpo_hub.tasks`)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **(shape or MODEL_SHAPE),
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def _write_model(folder: Path, seed: int) -> None:
    """Build tokenizer + model into `folder` (which must exist)."""
    tokenizer = train_tokenizer(seed)
    save_model(folder, init_model(tokenizer, seed), tokenizer)


def build_tiny_model(output_dir: str | os.PathLike | None = None, seed: int = 0) -> str:
    """Return a local folder holding the tiny model + tokenizer, building it on first use.

    Default folder: `<cache>/tiny-qwen2-seed<seed>-<build_fingerprint>`; built once per machine as described in
    `grpo_hub.tasks.model_cache.cached_build`.
    """
    check_seed(seed, "build_tiny_model")
    name = f"tiny-qwen2-seed{seed}-{build_fingerprint(seed)}"
    return cached_build(output_dir, name, lambda folder: _write_model(folder, seed), "build_tiny_model")
