"""Shared-prompt forwards (`GRPOHubConfig.shared_prompts`, padding-free's next level): each prompt of a micro-batch is
computed once for all its rows (`grpo_hub.algos.shared_prompts`), with an attention mask handed to the model.

The mask is not one transformers derives from position ids (those make a row of every restart, so a branch would lose
its prompt): it is built here and passed as the model's `attention_mask`, which transformers' `create_causal_mask`
returns as it is when it is 4D. Models differ in where they read it (`MASKS`): one mask for every layer, windowed or
not, or a dict by layer type (`config.layer_types`: "full_attention", "sliding_attention"); the sliding window is read
on the rows' own positions, as in the padded row. sdpa takes the boolean mask, eager an additive one (0 / the dtype's
minimum, as transformers' `eager_mask`). Only what a test proves exact against the padded forward is accepted
(`check_model`); anything else is refused naming `shared_prompts`.
"""

import torch
from accelerate.utils import is_peft_model

from grpo_hub.algos.shared_prompts import SharedPrompts, attention_allowed
from grpo_hub.errors import field_error

# How each model type of padding-free's EXACT_MODEL_TYPES reads its attention mask (transformers 5.24 modeling code):
# "full": one causal mask for every layer (create_causal_mask); "window": one mask for every layer, sliding when
# config.sliding_window is set (create_sliding_window_causal_mask); "layer_types": a dict keyed by config.layer_types.
# tests/training/test_shared_prompts.py runs each against the padded forward, sliding windows shorter than the rows.
MASKS = {
    "gemma": "full", "granite": "full", "llama": "full", "olmo2": "full",
    "mistral": "window", "phi3": "window", "qwen3_moe": "window",
    "gemma2": "layer_types", "gemma3_text": "layer_types", "qwen2": "layer_types", "qwen2_moe": "layer_types",
    "qwen3": "layer_types", "smollm3": "layer_types",
}  # fmt: skip


def _config(model):
    """The text config of `model`, through DDP / DeepSpeed wrappers (`.module`; a DeepSpeed engine's own `config` is
    its dict) and PEFT."""
    while not hasattr(getattr(model, "config", None), "get_text_config") and hasattr(model, "module"):
        model = model.module
    base = model.get_base_model() if is_peft_model(model) else model
    return base.config.get_text_config()


def check_model(model, role: str = "model") -> None:
    """Raise ValueError naming `shared_prompts` unless the attention mask it needs can be handed to `model`: a model
    type of `MASKS`, causal (no bidirectional attention), with a sliding window wherever a layer slides. Padding-free's
    own check (`training.padding_free.check_model`) runs first."""
    base = model.get_base_model() if is_peft_model(model) else model
    config, kind = _config(model), type(base).__name__

    def refuse(problem: str) -> None:
        field_error("shared_prompts", f"the {role} is {kind}, {problem}", "set shared_prompts=False.")

    if config.model_type not in MASKS:
        refuse(f"of model type {config.model_type!r}; shared prompts hand their attention mask only to "
               f"{', '.join(MASKS)} (each tested against the padded forward).")  # fmt: skip
    if getattr(config, "use_bidirectional_attention", False) or not getattr(config, "is_causal", True):
        refuse("with bidirectional attention; shared prompts build causal masks.")
    if "sliding_attention" in layer_windows(config) and config.sliding_window is None:
        refuse("with sliding-attention layers but no sliding_window.")


def layer_windows(config) -> dict[str | None, int | None]:
    """The masks `config`'s model reads: layer type (None: one mask for every layer) -> its sliding window."""
    layout = MASKS[config.model_type]
    if layout == "full":
        return {None: None}
    if layout == "window":
        return {None: config.sliding_window}
    return {
        kind: config.sliding_window if kind == "sliding_attention" else None
        for kind in set(config.layer_types)
    }


def attention_masks(model, packed: SharedPrompts) -> torch.Tensor | dict[str, torch.Tensor]:
    """The `attention_mask` argument that gives `model` the shared-prompt layout of `packed`: a 4D mask, or a dict of
    them by layer type; boolean for sdpa, additive in the model's dtype for eager."""
    config = _config(model)
    additive = config._attn_implementation == "eager"
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point()) if additive else None
    masks = {}
    for kind, window in layer_windows(config).items():
        allowed = attention_allowed(packed, window)
        if additive:
            allowed = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
                ~allowed, torch.finfo(dtype).min
            )
        masks[kind] = allowed
    return masks.get(None, masks)
