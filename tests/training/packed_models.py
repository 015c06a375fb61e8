"""Tiny models and run comparisons shared by the padding-free and shared-prompts tests: models of each type (sliding
windows shorter than the rows), hybrids, PEFT-wrapped models, the largest gap between a packed and a padded forward,
and the same-run check of two trainings."""

import math

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_hub.algos.padding_free import ATTENTION
from tests.training.dynamic.scripted import tool_trainer
from tests.training.helpers import StepProbe

EOS_BIAS = (
    6.0  # generation favours the end token: completions of 1-16 tokens, so TRL pads them to the longest
)


def varied_lengths(model_dir) -> dict:
    eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    return {"generation_kwargs": {"sequence_bias": [[[eos], EOS_BIAS]]}, "max_completion_length": 16}


def numeric_logs(trainer) -> list[dict]:
    """Each logged step's metrics, but times and padding_free's own share."""
    skip = ("time", "runtime", "per_second", "padding_free/")
    return [
        {k: v for k, v in h.items() if isinstance(v, float | int) and not any(s in k for s in skip)}
        for h in trainer.state.log_history
    ]


def assert_same_run(padded, packed, every_step_has_signal: bool = True):
    """`packed` scored fewer tokens than `padded` and equals it: gradients and every logged number. Each step's gradient
    is non-zero, or (`every_step_has_signal` False) some step's."""
    assert packed.scored_tokens < padded.scored_tokens  # the feature ran: fewer tokens reached the model
    nonzero = all if every_step_has_signal else any
    assert padded.grads and nonzero(g.abs().sum() > 0 for g in padded.grads)
    for a, b in zip(padded.grads, packed.grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    for a, b in zip(numeric_logs(padded.trainer), numeric_logs(packed.trainer), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-5), (key, a[key], b[key])


TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 96,
    "head_dim": 32,
    "pad_token_id": 0,
    "initializer_range": 0.5,
}  # fmt: skip  (weights of trained scale: a cross-row leak shows in whole logits)


# sliding windows shorter than the rows, where a model type has them
WINDOWS = {
    "mistral": {"sliding_window": 4},
    "qwen2": {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0},
    "qwen3": {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0},
    "gemma2": {"sliding_window": 4},
    "gemma3_text": {"sliding_window": 4},
    "phi3": {"sliding_window": 4},
}


def tiny_model(model_type: str, attention: str = "sdpa", **settings):
    from transformers import AutoConfig

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**TINY, **WINDOWS.get(model_type, {}), **settings})
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention).eval()


def rope_parameters(rope_type: str, original: int) -> dict:
    """`rope_parameters` of every RoPE type transformers 5.24 has ("default" and `ROPE_INIT_FUNCTIONS`), scaled where
    it scales, from a pretraining length of `original` positions (longrope's factors for heads of 32)."""
    return {
        "default": {},
        "linear": {"factor": 4.0},
        "dynamic": {"factor": 4.0},
        "yarn": {"factor": 4.0, "original_max_position_embeddings": original},
        "llama3": {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": original},
        "proportional": {"partial_rotary_factor": 0.5},
        "longrope": {"short_factor": [1.0] * 16, "long_factor": [4.0] * 16, "original_max_position_embeddings": original},
    }[rope_type]  # fmt: skip


def rope_model(rope_type: str, original: int, model_type: str = "llama"):
    """A tiny `model_type` with `rope_type` (`rope_parameters`) pretrained on `original` positions: a forward longer
    than that is where longrope takes its long factors and dynamic RoPE rescales (its threshold is
    max_position_embeddings; it returns to its own frequencies on a shorter one). Phi-3 reads the pretraining length
    from the config's top level, where its checkpoints keep it."""
    parameters = {"rope_type": rope_type, "rope_theta": 10000.0, **rope_parameters(rope_type, original)}
    longest = original if rope_type == "dynamic" else 4 * original
    return tiny_model(model_type, rope_parameters=parameters, max_position_embeddings=longest,
                      original_max_position_embeddings=original)  # fmt: skip


def uneven_batch() -> tuple[torch.Tensor, torch.Tensor, int]:
    """A padded batch of uneven rows (ids, attention mask, logits_to_keep): 5 rows in 14 columns, the first unpadded."""
    torch.manual_seed(1)
    ids = torch.randint(1, 96, (5, 14))
    mask = torch.ones_like(ids)
    for row, (pad_left, pad_right) in enumerate([(0, 0), (3, 2), (5, 0), (1, 6), (2, 3)]):
        mask[row, :pad_left] = 0
        mask[row, ids.size(1) - pad_right :] = 0
    return ids, mask, 8


def largest_packed_gap(model, fused_head_added: bool = False, batch=None) -> tuple[float, float]:
    """The largest gaps (log-probs, entropies) between the packed and the padded forward of `model` on a padded batch
    (`uneven_batch` unless `batch` gives ids, attention mask and logits_to_keep; fp32), every row of it in one bin."""
    from contextlib import nullcontext

    from trl.trainer.utils import add_fused_lm_head

    from grpo_hub.training.padding_free import PaddingFreeForward

    if not fused_head_added:
        add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids, mask, keep = batch or uneven_batch()
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    scored = labels[:, -keep:] != -100
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        packed = PaddingFreeForward(0, nullcontext, bin_tokens=1000)(
            model, ids, mask, keep, compute_entropy=True
        )
    logps, entropies = (out[:, -keep:] * scored for out in (padded.log_probs, padded.entropy))
    return (packed[0] - logps).abs().max().item(), (packed[1] - entropies).abs().max().item()


def attentions(model_type: str) -> list[str]:
    """The attention implementations padding-free runs that transformers builds `model_type` with."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    return [a for a in ATTENTION if a == "eager" or model_class._supports_sdpa]


HYBRIDS = {  # one convolution / Mamba / gated-delta layer and one attention layer each
    "lfm2": {"layer_types": ["conv", "full_attention"]},
    "falcon_h1": {"mamba_d_ssm": 32, "mamba_n_heads": 2, "mamba_d_head": 16, "mamba_chunk_size": 4},
    "bamba": {"attn_layer_indices": [1], "mamba_d_head": 32, "mamba_n_heads": 4, "mamba_chunk_size": 4},
    "qwen3_next": {"layer_types": ["linear_attention", "full_attention"], "num_experts": 0},
}


def peft_configs() -> dict:
    import peft

    kind = "CAUSAL_LM"
    return {
        "LORA": peft.LoraConfig(task_type=kind, target_modules="all-linear"),
        "LOHA": peft.LoHaConfig(task_type=kind, target_modules=["q_proj", "v_proj", "down_proj"]),
        "LOKR": peft.LoKrConfig(task_type=kind, target_modules=["q_proj", "v_proj", "down_proj"]),
        "IA3": peft.IA3Config(
            task_type=kind, target_modules=["k_proj", "down_proj"], feedforward_modules=["down_proj"]
        ),
        "PROMPT_TUNING": peft.PromptTuningConfig(task_type=kind, num_virtual_tokens=4),
        "P_TUNING": peft.PromptEncoderConfig(task_type=kind, num_virtual_tokens=4, encoder_hidden_size=32),
        "PREFIX_TUNING": peft.PrefixTuningConfig(task_type=kind, num_virtual_tokens=4),
    }


# LoraConfig options beyond plain LoRA (peft 0.21) that act on each token alone: the model type each runs on and the
# options (LoRA on every linear layer unless they say otherwise). Layer replication runs on Llama: with a dict of masks
# by layer type (Qwen2's) transformers 5.24 indexes layer_types past their end.
def lora_options() -> dict[str, tuple[str, dict]]:
    from peft.tuners.lora.config import BdLoraConfig, KasaConfig

    block_diagonal = BdLoraConfig(target_modules_bd_a=["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"],
                                  target_modules_bd_b=["o_proj", "down_proj"], nblocks=2)  # fmt: skip
    return {
        "use_dora": ("qwen2", {"use_dora": True}),
        "use_rslora": ("qwen2", {"use_rslora": True}),
        "lora_bias": ("qwen2", {"lora_bias": True}),
        "use_bdlora": ("qwen2", {"use_bdlora": block_diagonal}),
        "kasa_config": ("qwen2", {"kasa_config": KasaConfig()}),
        "mica": ("qwen2", {"init_lora_weights": "mica"}),
        "trainable_token_indices": ("qwen2", {"trainable_token_indices": [5, 9, 17]}),
        "modules_to_save": ("qwen2", {"modules_to_save": ["embed_tokens"]}),
        "layer_replication": ("llama", {"layer_replication": [[0, 2], [1, 2]]}),
        "target_parameters": ("qwen2_moe", {"target_modules": [],
                                            "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}),
    }  # fmt: skip


def lora_model(model_type: str = "qwen2", **options):
    """The tiny `model_type` with its fused LM head in a LoRA adapter of `options` (every linear layer unless they
    name targets), random trained-scale weights."""
    import peft

    config = peft.LoraConfig(task_type="CAUSAL_LM", **{"target_modules": "all-linear", **options})
    return wrap_peft(tiny_model(model_type), config, seed=0)


def peft_model(peft_type: str):
    """The tiny Qwen2 with its fused LM head, wrapped in a `peft_type` adapter of random trained-scale weights."""
    return wrap_peft(tiny_model("qwen2"), peft_configs()[peft_type])


def wrap_peft(model, config, seed: int | None = None):
    """`model` with its fused LM head, wrapped in `config`'s adapter of random trained-scale weights (drawn from
    `seed` if given: the same draw whatever the adapter's own initialisation took from the generator)."""
    import peft
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # TRL adds it before PEFT wraps the model
    model = peft.get_peft_model(model, config).eval()
    if seed is not None:
        torch.manual_seed(seed)
    for parameter in model.parameters():
        if parameter.requires_grad:
            parameter.data.normal_(0, 0.3)
    return model


def probed_tool_run(tmp_path, model_dir, **settings) -> StepProbe:
    """Two steps at learning rate 0 of the tool-calling trainer with `settings`; the probe holds its gradients,
    forwards and scored tokens, and the trainer."""
    trainer = tool_trainer(tmp_path, model_dir, max_steps=2, learning_rate=0.0, **settings)
    probe = StepProbe()
    trainer.add_callback(probe)
    trainer.model.register_forward_pre_hook(probe.count, with_kwargs=True)
    trainer.train()
    probe.trainer = trainer
    return probe
