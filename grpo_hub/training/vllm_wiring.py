"""The trainer's vLLM wiring at build time, between the settings (`grpo_hub.config.vllm_checks`) and the generation
side (`grpo_hub.generation.vllm_setup`, which never reads the config): the context TRL builds its vLLM generation in;
once it is built, where vLLM's IS ratio comes from (said once), the weight sync and, in server mode, the server checks
and the asynchronous rollouts.
"""

from accelerate.utils import is_peft_model

from grpo_hub.config import features
from grpo_hub.config.vllm_checks import is_path_line, scoring_forward_reason, uses_sampler_logprobs
from grpo_hub.generation.async_rollouts import AsyncRollouts
from grpo_hub.generation.vllm_setup import ServerSettings, building_generation, prepare_vllm
from grpo_hub.training.reference import trained_adapter_name


def colocate_adapter(args) -> bool:
    """Colocate mode with the adapter-only weight sync (`vllm_adapter_sync`): TRL builds a LoRA-enabled engine."""
    return features.is_on("vllm_adapter_sync", args) and args.vllm_mode == "colocate"


def building(args, model, peft_config):
    """The context TRL builds its `VLLMGeneration` in (`generation.vllm_setup.building_generation`), for `args`: the
    colocate adapter engine, grpo_hub's HTTP sync client in server mode, vLLM's install checked."""
    server_sync = args.vllm_server_sync if features.is_on("vllm_server_sync", args) else None
    return building_generation(args.use_vllm, colocate_adapter(args), server_sync, model, peft_config)


def server_settings(args, model, num_generations: int) -> ServerSettings:
    """The `vllm_server_*` fields and `max_staleness` of `args` (a GRPOHubConfig), the served model's name and its
    trained adapter (None unless `model` is a PeftModel)."""
    return ServerSettings(
        sync=args.vllm_server_sync, sync_dir=args.vllm_server_sync_dir, max_staleness=args.max_staleness,
        reads_sampler_logprobs=uses_sampler_logprobs(args), model_name=model.config._name_or_path,
        adapter=trained_adapter_name(model) if is_peft_model(model) else None, num_generations=num_generations,
    )  # fmt: skip


def prepare(
    args, model, generation, *, num_generations: int, use_loss_time_is, print_line, add_callback, collectives,
    metrics,
) -> AsyncRollouts | None:  # fmt: skip
    """With `vllm_importance_sampling_correction`, `use_loss_time_is(on)` (the trainer's: the ratio from the training
    forward where exact, else TRL's scoring forward) and the choice printed (`print_line`); then
    `generation.vllm_setup.prepare_vllm` of TRL's `generation` (the weight sync; in server mode the server checks and
    the asynchronous rollouts, returned: None when synchronous)."""
    if args.vllm_importance_sampling_correction:
        reason = scoring_forward_reason(args)
        use_loss_time_is(reason is None)
        print_line(is_path_line(reason))
    return prepare_vllm(
        generation, server_settings(args, model, num_generations), colocate_adapter=colocate_adapter(args),
        add_callback=add_callback, collectives=collectives, metrics=metrics,
    )  # fmt: skip
