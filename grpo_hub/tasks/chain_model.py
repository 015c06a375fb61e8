"""Offline *pretrained* model for the chain task, shipped as package data and reproducible by its build.

`chain_model_path()` returns the folder the recipe and the benchmark load: the weights shipped in
`grpo_hub/tasks/data/chain-model/` when their recorded fingerprint matches `build_recipe()`, else a build
cached under `$GRPO_HUB_CACHE` (`build_chain_model()`). The build makes the character-level tokenizer of the
arithmetic model, initialises a Qwen2 of `MODEL_SHAPE` and trains it with supervised next-token loss on
worked solutions ("37+5*3-4=" -> "37+5=42,42*3=126,126-4=122") of synthetic problems (`grpo_hub.tasks.chain`, never a held-out one),
single-threaded with deterministic algorithms. It is stopped early, partly right: nearly right on one and two
steps, mostly wrong on three and four, with sampling right far more often than greedy decoding (docs/tasks.md).

    python -m grpo_hub.tasks.chain_model --output-dir DIR    # build into DIR (new or empty)
    python -m grpo_hub.tasks.chain_machines --ship    # rebuild the shipped weights (~8-13 min on one core)

Every build records its trace (`grpo_hub.tasks.build_trace`): the state's checksum after `TRACE_STEPS` and the
digest of its inputs (`build_inputs_digest`). The shipped folder's machines record (`grpo_hub.tasks.chain_machines`)
keeps the trace of each CPU kind's full build that reproduced the shipped weights: on such a machine a short build
proves them reproducible. After an edit to a module in `BUILD_MODULES`, run `python -m grpo_hub.tasks.chain_machines`
to record the new digest, or with `--ship` (git then shows whether the weights changed). That module imports this one,
never the other way round.
"""

from __future__ import annotations

import importlib
import json
import os
import random
from pathlib import Path

from grpo_hub.tasks import chain
from grpo_hub.tasks.arithmetic import CHAT_TEMPLATE
from grpo_hub.tasks.arithmetic_model import ProblemEncoder, problem_batches, supervised_train
from grpo_hub.tasks.build_trace import StepRecorder, inputs_digest, write_trace
from grpo_hub.tasks.model_cache import cached_build, check_seed, fingerprint, save_model
from grpo_hub.tasks.tiny_model import SPECIAL_TOKENS, byte_level_tokenizer, init_model

BUILD_VERSION = "1"  # bump when the build changes in a way the recipe below does not show
SHIPPED_DIR = Path(__file__).parent / "data" / "chain-model"
RECIPE_FILE = "build_recipe.json"
MODEL_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 96,
}
SFT_RECIPE = {"steps": 1100, "batch_size": 64, "learning_rate": 3e-3, "warmup_steps": 50, "grad_clip": 1.0}
# Steps whose state every build records: the initial weights, the first step, warm-up, and past warm-up's end.
TRACE_STEPS = (0, 1, 25, 60)
# The modules a build runs (their source is part of the inputs digest; tests check that the build imports no other).
BUILD_MODULES = (
    "grpo_hub.tasks.arithmetic",
    "grpo_hub.tasks.arithmetic_model",
    "grpo_hub.tasks.build_trace",
    "grpo_hub.tasks.chain",
    "grpo_hub.tasks.chain_model",
    "grpo_hub.tasks.model_cache",
    "grpo_hub.tasks.text",
    "grpo_hub.tasks.tiny_model",
)


def build_recipe(seed: int = 0, sft: dict | None = None) -> dict:
    """Everything that shapes the weights (the fingerprint's input)."""
    return {
        "version": BUILD_VERSION,
        "task": "chain",
        "specials": SPECIAL_TOKENS,
        "chat_template": CHAT_TEMPLATE,
        "shape": MODEL_SHAPE,
        "sft": {**SFT_RECIPE, **(sft or {})},
        "heldout": fingerprint({"questions": [p.question for p in chain.heldout_problems()]}),
        "solution_format": chain.make_problem(random.Random("format"), max(chain.LEVELS)).solution,
        "seed": seed,
    }


def char_tokenizer():
    """Byte-level BPE without merges (every character one token) with the compact chat template."""
    from tokenizers import pre_tokenizers

    vocab = len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIAL_TOKENS)
    return byte_level_tokenizer(vocab, [], CHAT_TEMPLATE, MODEL_SHAPE["max_position_embeddings"])


def sft_batches(encoder: ProblemEncoder, seed: int, batch_size: int):
    """Endless batches of (chat prompt, worked solution + EOS), levels uniform, never a held-out problem."""
    rng = random.Random(f"chain-sft-{seed}")

    def draw() -> tuple[str, str]:
        problem = chain.make_problem(rng, rng.choice(chain.LEVELS))
        return problem.question, problem.solution

    return problem_batches(encoder, draw, {p.question for p in chain.heldout_problems()}, batch_size)


def build_inputs_digest(seed: int = 0, sft: dict | None = None) -> str:
    """Digest of what shapes the build of `build_recipe(seed, sft)`: the recipe, `BUILD_MODULES`' source, the
    tokenizer and torch's version (`grpo_hub.tasks.build_trace.inputs_digest`)."""
    modules = [importlib.import_module(name) for name in BUILD_MODULES]
    return inputs_digest(build_recipe(seed, sft), modules, char_tokenizer().backend_tokenizer.to_str())


def _write_model(folder: Path, seed: int, sft: dict) -> None:
    tokenizer = char_tokenizer()
    model = init_model(tokenizer, seed, shape=MODEL_SHAPE)
    recorder = StepRecorder(TRACE_STEPS)
    batches = sft_batches(ProblemEncoder(tokenizer), seed, sft["batch_size"])
    supervised_train(model, batches, seed, sft, observe=recorder)
    save_model(folder, model, tokenizer)
    (folder / RECIPE_FILE).write_text(json.dumps(build_recipe(seed, sft), indent=1, sort_keys=True))
    write_trace(folder, build_inputs_digest(seed, sft), recorder.checksums, "model.safetensors")


def build_chain_model(
    output_dir: str | os.PathLike | None = None, seed: int = 0, sft: dict | None = None
) -> str:
    """Build (or find, by fingerprint) the chain model; default folder `<cache>/chain-qwen2-seed<seed>-<fp>`.

    `sft` overrides `SFT_RECIPE` entries (e.g. a few steps in tests); the fingerprint covers them."""
    check_seed(seed, "build_chain_model")
    unknown = set(sft or {}) - set(SFT_RECIPE)
    if unknown:
        raise ValueError(
            f"build_chain_model: unknown sft setting(s) {sorted(unknown)}; known: {sorted(SFT_RECIPE)}"
        )
    recipe = build_recipe(seed, sft)
    name = f"chain-qwen2-seed{seed}-{fingerprint(recipe)}"
    return cached_build(
        output_dir, name, lambda folder: _write_model(folder, seed, recipe["sft"]), "build_chain_model"
    )


def shipped_is_current() -> bool:
    """True when the shipped folder holds weights built by today's default recipe."""
    recorded = SHIPPED_DIR / RECIPE_FILE
    return recorded.is_file() and json.loads(recorded.read_text()) == build_recipe()


def chain_model_path() -> str:
    """The default chain model: the shipped weights when they match the recipe, else a cached build."""
    return str(SHIPPED_DIR) if shipped_is_current() else build_chain_model()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        description="Build the chain model (to ship it: python -m grpo_hub.tasks.chain_machines --ship)."
    )
    parser.add_argument(
        "--output-dir", default=None, help="build into this folder (default: the model cache)"
    )
    print(build_chain_model(parser.parse_args().output_dir))
