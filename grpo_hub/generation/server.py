"""Server mode: TRL's `VLLMClient` against vLLM's own OpenAI server, checked before training starts."""

from __future__ import annotations

from grpo_hub.errors import field_error


def check_server_logprobs_mode(server_info: dict) -> None:
    """Raise where TRL only warns, when the server's log-probs are not `processed_logprobs` (call it only when
    training reads the sampler's log-probs: the IS correction or TRL's off-policy mask).

    vLLM's default `raw_logprobs` are taken before temperature (and truncation), so with temperature != 1 the
    IS ratio would compare two different distributions. `trl vllm-serve` passes `processed_logprobs` itself.
    """
    mode = server_info["model_config"]["logprobs_mode"]
    if mode != "processed_logprobs":
        field_error(
            "vllm_mode",
            f"the vLLM server returns {mode!r} log-probs (before temperature and truncation), but the trainer "
            "compares them with log-probs after temperature.",
            "restart the server with `--logprobs-mode processed_logprobs` (`trl vllm-serve` does), or set "
            "vllm_importance_sampling_correction=False and off_policy_mask_threshold=None.",
        )
