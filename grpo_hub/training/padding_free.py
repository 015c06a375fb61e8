"""Padding-free forwards (`GRPOHubConfig.padding_free`): every policy and reference forward of the trainer runs over
the rows' real tokens only, packed into bins (`grpo_hub.algos.padding_free`), and returns TRL's padded layout.

It stands in for TRL's `_get_per_token_logps_and_entropies` (the training forward, TRL's scoring forward, the
reference model or adapter, KL-in-reward rescoring all call it), with the fused LM head TRL adds to the model
(`labels=..., fused_lm_head=True`). Supported (`check_model`): only what a test proves exact. Model types whose every
layer is attention with rotary or no position embeddings (scores depend on position differences only, so restarting
positions per row changes fp32 rounding, not the result) and whose masks come from transformers' `create_causal_mask`
(restarting position ids make a block-diagonal mask), with sdpa or eager attention, no MoE router loss, RoPE types
whose frequencies the config fixes; PEFT types and LoRA variants that act on each token alone. Hybrids
(short-convolution, Mamba, linear-attention layers) carry state across a bin's row boundaries; PEFT prompt learning
prepends virtual tokens and drops the position ids; dynamic RoPE and longrope choose their frequencies from the
longest position of a forward; aLoRA finds its invocation tokens over a whole bin: each is refused by name
(docs/padding-free.md has the table).
"""

import dataclasses
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from accelerate.utils import is_peft_model

from grpo_hub.algos.padding_free import ATTENTION, pack_rows, unpack
from grpo_hub.algos.shared_prompts import pack_groups
from grpo_hub.errors import field_error
from grpo_hub.training import shared_prompts

# Bins of about max(BIN_TOKENS, 2 x the longest row) tokens (algos.padding_free.bin_count). Measured on the main
# job's batch (chain model, 64 rows of 13 + 22 tokens on average, longest 55; fwd + bwd, LoRA, sdpa; median of 10,
# one thread / two threads): bins of 96-256 tokens take 0.64-0.74x / 0.65-0.68x of the padded forward, with no
# consistent order among them; one row of all 2,256 tokens 1.9x (attention is quadratic in a bin, and its mask is
# materialised). 192 leaves the least padding: 0.5 % there (128: 1.3 %), and in the main job's 200 steps, where rows
# grow to ~60 tokens and bins of 128 hold two of them, 128 left 2.9 %.
BIN_TOKENS = 192


# Model types (transformers' own modeling code) whose every layer is attention, proven exact against the padded
# forward with sliding windows where they have them (tests/training/test_padding_free.py runs each one). Anything else,
# hybrids above all (LFM2, Granite-4.0-H, Falcon-H1, Bamba, Zamba2, Qwen3-Next: their convolution, Mamba or
# gated-delta layers read across a bin's row boundaries), is refused until a test adds it here.
EXACT_MODEL_TYPES = (
    "gemma", "gemma2", "gemma3_text", "granite", "llama", "mistral", "olmo2", "phi3", "qwen2", "qwen2_moe", "qwen3",
    "qwen3_moe", "smollm3",
)  # fmt: skip
# PEFT types whose layers act on each token alone (tested likewise). Prompt learning (prompt tuning, p-tuning,
# multitask prompt tuning) prepends virtual tokens and drops the position ids; prefix tuning passes a cache, so
# transformers does not read packed rows: each is refused.
EXACT_PEFT_TYPES = ("IA3", "LOHA", "LOKR", "LORA")
# LoRA variants (peft 0.21: the LoraConfig fields it marks `is_lora_variant`, and init_lora_weights="mica") that act on
# each token alone, tested likewise. Any other is refused: aLoRA (`alora_invocation_tokens`) switches the adapter on
# from where its invocation tokens sit in each row, and finds them over a whole bin; VeLoRA's backward projects the
# layer inputs on their average over the whole input, padding included; Arrow and MonteCLoRA are not tested.
EXACT_LORA_VARIANTS = ("kasa_config", "mica", "use_bdlora", "use_dora")
LORA_VARIANT_PROBLEMS = {
    "alora_invocation_tokens": "aLoRA turns the adapter on from where its invocation tokens sit in each row, and "
    "looks for them over a whole bin",
    "velora_config": "VeLoRA's backward projects the layer inputs on their average over the whole input, padding "
    "included",
}
# RoPE types (transformers 5.24: "default" and ROPE_INIT_FUNCTIONS) whose frequencies the config fixes, so scores
# depend on position differences only (tested on each). "dynamic" and "longrope" choose theirs from max(position_ids) + 1
# of the whole forward (TRL's padded width; a bin's longest row here), and "dynamic" caches them across forwards: both
# are refused, as is a type not listed.
EXACT_ROPE_TYPES = ("default", "linear", "yarn", "llama3", "proportional")


def check_model(model, role: str = "model", shared: bool = False) -> None:
    """Raise ValueError naming `padding_free` unless `model` (PEFT-wrapped or not) is one padding-free is proven exact
    on: a model type of `EXACT_MODEL_TYPES` from transformers' own code, RoPE types of `EXACT_ROPE_TYPES`, every
    adapter of `EXACT_PEFT_TYPES` (a LoRA one with variants of `EXACT_LORA_VARIANTS` only); with `shared`
    (shared_prompts), also one that takes the shared-prompt mask (`training.shared_prompts.check_model`)."""
    # a DDP / DeepSpeed engine: TRL prepares a separate reference model before this check
    while not hasattr(getattr(model, "config", None), "get_text_config") and hasattr(model, "module"):
        model = model.module
    base = model.get_base_model() if is_peft_model(model) else model
    config, kind = base.config, type(base).__name__

    def refuse(problem: str) -> None:
        field_error("padding_free", f"the {role} is {kind}, {problem}", "set padding_free=False.")

    if config.get_text_config() is not config:
        refuse("a vision-language model: its image tokens and position ids are not packed.")
    own_code = type(base).__module__.startswith("transformers.models.")
    if config.model_type not in EXACT_MODEL_TYPES or not own_code:
        refuse(f"of model type {config.model_type!r} from {type(base).__module__}; padding-free is proven exact only "
               f"on transformers' own {', '.join(EXACT_MODEL_TYPES)} (every layer attention: a convolution, Mamba or "
               "linear-attention layer reads across packed rows).")  # fmt: skip
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ATTENTION:
        refuse(f"with attn_implementation={attention!r}; padding-free runs with {' or '.join(ATTENTION)}.")
    backbone = getattr(base, base.base_model_prefix, None)
    if not hasattr(sys.modules[type(backbone).__module__], "create_causal_mask"):
        refuse("whose attention mask is not built by transformers' create_causal_mask, which reads restarting "
               "position ids as separate rows.")  # fmt: skip
    if getattr(config.get_text_config(), "output_router_logits", False):
        refuse("a mixture of experts with its router loss on, which would count the bins' padding.")
    for layer_type, rope_type in rope_types(config.get_text_config()).items():
        if rope_type not in EXACT_ROPE_TYPES:
            layers = f" on its {layer_type} layers" if layer_type else ""
            refuse(f"with rope_type={rope_type!r}{layers}; padding-free is proven exact only with RoPE types "
                   f"{', '.join(EXACT_ROPE_TYPES)} (dynamic and longrope choose their frequencies from the longest "
                   "position of each forward: TRL's padded width, a bin's longest row here).")  # fmt: skip
    for name, adapter in getattr(model, "peft_config", {}).items():
        peft_type = getattr(adapter.peft_type, "value", adapter.peft_type)
        if peft_type not in EXACT_PEFT_TYPES:
            refuse(f"wrapped in a PEFT {peft_type} adapter ({name!r}); padding-free is proven exact only with "
                   f"{', '.join(EXACT_PEFT_TYPES)} (prompt learning and prefix tuning do not see packed rows).")  # fmt: skip
        for variant in lora_variants(adapter) if peft_type == "LORA" else ():
            if variant not in EXACT_LORA_VARIANTS:
                refuse(f"wrapped in a LoRA adapter ({name!r}) with {variant} "
                       f"({LORA_VARIANT_PROBLEMS.get(variant, 'not tested')}); padding-free is proven exact only with "
                       f"the LoRA variants {', '.join(EXACT_LORA_VARIANTS)}.")  # fmt: skip
    if shared:
        shared_prompts.check_model(model, role)


def rope_types(config) -> dict[str | None, str]:
    """The RoPE type of each layer type of a text `config` (None: every layer), as transformers 5.24 keeps it:
    `config.rope_parameters` is one dict with its "rope_type", or one such dict per layer type (Gemma 3)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    if all(isinstance(value, dict) for value in parameters.values()) and "rope_type" not in parameters:
        return {kind: value.get("rope_type", "default") for kind, value in parameters.items()}
    return {None: parameters.get("rope_type", "default")}


def lora_variants(adapter) -> list[str]:
    """The LoRA variants a peft `LoraConfig` turns on: the fields peft marks `is_lora_variant` that are set, and the
    `init_lora_weights` value if it is one of the variants that field lists (peft 0.21,
    `LoraLayer.resolve_lora_variant`)."""
    found = []
    for field in dataclasses.fields(adapter):
        value = getattr(adapter, field.name)
        if field.metadata.get("is_lora_variant") and value:
            found.append(field.name)
        elif isinstance(value, str) and value in field.metadata.get("lora_variants", ()):
            found.append(value)
    return found


class PaddingFreeForward:
    """TRL's `_get_per_token_logps_and_entropies` over packed rows, or with `shared` each prompt once for its rows
    (`training.shared_prompts`); counts the tokens each forward computed."""

    def __init__(
        self, pad_token_id: int, autocast: Callable[[], AbstractContextManager], bin_tokens: int = BIN_TOKENS,
        shared: bool = False,
    ):  # fmt: skip
        self.pad_token_id, self.autocast, self.bin_tokens = pad_token_id, autocast, bin_tokens
        self.shared = shared
        # tokens computed (real and the bins' tails) and the rows' real tokens, since the last `take_shares`
        self.real_tokens = self.pad_tokens = self.row_tokens = 0

    def __call__(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **multimodal,
    ):  # fmt: skip
        """Per-token log-probs and entropies (None unless `compute_entropy`) in TRL's `(rows, logits_to_keep)` layout,
        over row chunks of `batch_size` as TRL's, and no MoE loss (None). Image inputs or a MoE loss (which
        `check_model` refuses up front) are an error."""
        extras = [name for name, value in multimodal.items() if value is not None]
        if compute_aux_loss or extras:
            field_error("padding_free", f"got {extras or 'a MoE router loss'}, which it does not pack.",
                        "set padding_free=False.")  # fmt: skip
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            pack = pack_groups if self.shared else pack_rows
            packed = pack(
                input_ids[rows], attention_mask[rows], logits_to_keep, self.bin_tokens, self.pad_token_id
            )
            self.real_tokens += packed.real_tokens
            self.pad_tokens += packed.pad_tokens
            self.row_tokens += getattr(packed, "row_tokens", packed.real_tokens)
            masks = {"attention_mask": shared_prompts.attention_masks(model, packed)} if self.shared else {}
            with self.autocast():
                outputs = model(
                    input_ids=packed.input_ids, position_ids=packed.position_ids, labels=packed.labels,
                    fused_lm_head=True, **masks,
                )  # fmt: skip
            logps.append(unpack(outputs.log_probs, packed))
            if compute_entropy:
                entropies.append(unpack(outputs.entropy, packed))
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def log_shares(self, metrics) -> None:
        """Append `take_shares` to `metrics` (the trainer's metrics of the mode being run), one value per key."""
        for key, share in self.take_shares().items():
            metrics[key].append(share)

    def take_shares(self) -> dict[str, float]:
        """The shares of the tokens since the last call: padding among those computed (`pad_share`), and with `shared`
        the rows' real tokens not computed (`prompt_share_saved`: repeated prompts)."""
        computed = max(self.real_tokens + self.pad_tokens, 1)
        shares = {"padding_free/pad_share": self.pad_tokens / computed}
        if self.shared:
            shares["padding_free/prompt_share_saved"] = 1 - self.real_tokens / max(self.row_tokens, 1)
        self.real_tokens = self.pad_tokens = self.row_tokens = 0
        return shares


def trainer_forward(args, model, ref_model, pad_token_id: int, autocast) -> PaddingFreeForward | None:
    """The trainer's forward with `args.padding_free` (a GRPOHubConfig; each prompt once with `shared_prompts`), after
    `check_model` of the policy and of a separate reference model (`ref_model`, or None); None without it."""
    if not args.padding_free:
        return None
    check_model(model, shared=args.shared_prompts)
    if ref_model is not None:
        check_model(ref_model, "reference model", shared=args.shared_prompts)
    return PaddingFreeForward(pad_token_id, autocast, shared=args.shared_prompts)
