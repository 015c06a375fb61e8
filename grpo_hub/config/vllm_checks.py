"""Config-time rules for vLLM generation with the importance-sampling (IS) correction.

The correction weights each token by exp(log π_trainer - log π_sampler) (see `grpo_hub.algos.importance`). It is only
a correction if both log-probs describe the SAME distribution. TRL 1.16 builds the colocate engine with
`logprobs_mode="processed_logprobs"` (vLLM 0.32: log-softmax AFTER temperature, penalties, min-tokens,
top-k/top-p/min-p) and checks a server's mode at start-up, while the trainer takes a full-vocabulary
log-softmax of logits / temperature. So temperature agrees, and everything else that reshapes vLLM's
distribution does not: top-k/top-p/min-p renormalise over the kept tokens, which multiplies every ratio by
the kept mass S (trl#6789), and penalties/constraints move it by amounts the trainer never sees.
`check_sampler_matches_trainer` rejects those settings; `check_is_bounds` checks the bounds once
`vllm_is_preset` is applied (grpo_hub.config.resolve_and_validate). No torch or vLLM import: this runs inside `GRPOHubConfig.__post_init__`.
"""

from __future__ import annotations

from grpo_hub.errors import field_error

# vLLM 0.32 `SamplingParams`: a positive temperature below this is raised to it (`_MAX_TEMP`), while the
# trainer keeps dividing by the configured value.
VLLM_MIN_TEMPERATURE = 1e-2
TRL_DEFAULT_IS_MODE, TRL_DEFAULT_CLIP_MAX = "sequence_mask", 3.0
# AgileRL GRPO (agilerl/algorithms/grpo.py): w_t = clamp(exp(logp_trainer - logp_vllm), max=cap), token level,
# no lower bound, `vllm_importance_sampling_cap=2.0` by default.
AGILERL_TOKEN_CAP = 2.0
VLLM_IS_PRESETS = {
    "agilerl": {"mode": "token_truncate", "clip_min": None, "clip_max": AGILERL_TOKEN_CAP},
}
# Sampling settings, as TRL passes them to vLLM, and the value at which they leave the distribution alone.
NEUTRAL_SAMPLING = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
# `generation_kwargs` keys vLLM applies before `processed_logprobs`, with their neutral values.
NEUTRAL_GENERATION_KWARGS = {
    **NEUTRAL_SAMPLING,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_tokens": 0,
    "logit_bias": None,
    "bad_words": None,
    "allowed_token_ids": None,
    "structured_outputs": None,
}


def _is_neutral(key: str, value) -> bool:
    if value is None or (key == "top_k" and value == -1):  # None: TRL's "off"; -1 also disables top-k in vLLM
        return True
    neutral = NEUTRAL_GENERATION_KWARGS[key]
    return value == neutral or (neutral is None and not value)


def check_is_bounds(config) -> None:
    """The IS bounds (after `vllm_is_preset` is applied): positive, and clip_min < clip_max."""
    low = config.vllm_importance_sampling_clip_min
    high = config.vllm_importance_sampling_clip_max
    if config.vllm_importance_sampling_cap is not None:  # TRL's deprecated alias of clip_max
        high = config.vllm_importance_sampling_cap
    for name, bound in (
        ("vllm_importance_sampling_clip_min", low),
        ("vllm_importance_sampling_clip_max", high),
    ):
        if bound is not None and not bound > 0:
            field_error(
                name,
                f"an IS ratio is positive, so the bound must be > 0, got {bound}.",
                "use None for no bound.",
            )
    if low is not None and high is not None and not low < high:
        field_error(
            "vllm_importance_sampling_clip_min",
            f"must be < vllm_importance_sampling_clip_max, got {low} >= {high}.",
            "lower the lower bound (e.g. 0.5) or raise the upper one (e.g. 2.0).",
        )


def uses_sampler_logprobs(config) -> bool:
    """Whether training consumes vLLM's sampling log-probs (IS correction or TRL's off-policy mask)."""
    return config.use_vllm and (
        config.vllm_importance_sampling_correction or config.off_policy_mask_threshold is not None
    )


def check_sampler_matches_trainer(config) -> None:
    """Raise where vLLM's returned log-probs and the trainer's would describe different distributions."""
    if not uses_sampler_logprobs(config):
        return
    fix = (
        "turn the correction off (vllm_importance_sampling_correction=False, off_policy_mask_threshold=None)."
    )
    if 0 < config.temperature < VLLM_MIN_TEMPERATURE:
        field_error(
            "temperature",
            f"vLLM raises {config.temperature} to {VLLM_MIN_TEMPERATURE} while the trainer divides by "
            f"{config.temperature}, so the IS ratio compares two temperatures.",
            f"use temperature >= {VLLM_MIN_TEMPERATURE}.",
        )
    for name, neutral in NEUTRAL_SAMPLING.items():
        value = getattr(config, name)
        if not _is_neutral(name, value):
            field_error(
                name,
                f"{value} changes vLLM's sampling distribution (its processed log-probs include it) but not the "
                "trainer's full-vocabulary log-probs, so every IS ratio is biased (for top-p/top-k/min-p by the kept "
                "probability mass, trl#6789).",
                f"use {name}={neutral}, or {fix}",
            )
    for key, value in (config.generation_kwargs or {}).items():
        if key == "temperature" and value != config.temperature:
            field_error(
                "generation_kwargs",
                f"temperature={value} reaches vLLM but the trainer scales logits by temperature={config.temperature}.",
                "set `temperature` instead of generation_kwargs['temperature'].",
            )
        if key in NEUTRAL_GENERATION_KWARGS and not _is_neutral(key, value):
            field_error(
                "generation_kwargs",
                f"{key}={value!r} changes vLLM's sampling distribution but not the trainer's log-probs, which biases "
                "the IS ratio.",
                f"drop generation_kwargs[{key!r}], or {fix}",
            )
    if config.vllm_structured_outputs_regex is not None:
        field_error(
            "vllm_structured_outputs_regex",
            "constrained decoding masks tokens in vLLM but not in the trainer, which biases the IS ratio.",
            f"unset it, or {fix}",
        )


def scoring_forward_reason(config) -> str | None:
    """Why TRL's no-grad scoring forward must run for vLLM's IS correction, or None where its `old_per_token_logps`
    equal the training forward's detached log-probs, so the ratio is taken from that forward instead
    (`generation.loss_time_is`; huggingface/trl#5412). They are equal when every generated row is trained once, by the
    policy that generated it: one iteration, and a generation batch that ends with an optimizer step (TRL's own
    alignment rule, `gradient_accumulation_steps % (steps_per_generation * num_iterations) == 0`)."""
    if config.num_iterations != 1:
        return (
            f"num_iterations={config.num_iterations}: later iterations train rows scored by an older policy"
        )
    generate_every = config.steps_per_generation * config.num_iterations
    if config.gradient_accumulation_steps % generate_every:
        return (
            f"steps_per_generation={config.steps_per_generation} does not divide gradient_accumulation_steps="
            f"{config.gradient_accumulation_steps}: a generation batch spans optimizer steps"
        )
    if config.loss_type == "vespo":
        return "loss_type='vespo': its weights read the IS ratio, a path not verified here"
    return None


def is_path_line(reason: str | None) -> str:
    """The line a run with vLLM's IS correction prints once: where its ratio comes from, and why (`reason`: what
    `scoring_forward_reason` returned)."""
    if reason is None:
        return (
            "vLLM IS correction: ratio from the training forward (on-policy: the old log-probs equal its own), "
            "no scoring forward"
        )
    return f"vLLM IS correction: TRL's scoring forward computes the old log-probs ({reason})"
