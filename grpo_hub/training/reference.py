"""Frozen "ref" adapter for LoRA GRPO: creation, refresh (hard copy or EMA) and checkpointing.

TRL 1.16 computes the KL reference of a PEFT model from an adapter named "ref" when the PeftModel has
one, else from the base model with adapters disabled; it creates "ref" only when handed an already
wrapped PeftModel with beta != 0, and `sync_ref_model=True` with PEFT raises NotImplementedError
(trl#3108). This module fills that gap:

* `add_reference_adapter` adds a frozen "ref" adapter initialised EQUAL to the trained adapter (a
  copy, like TRL's own "ref"; for a freshly initialised LoRA, whose B is zero, that is the zero delta,
  so the reference is the base model until the first refresh). It never becomes trainable or active.
* `refresh_reference_adapter` updates it in parameter space, pairing tensors by name (the path
  component naming the trained adapter, usually "default", replaced by "ref"):
  `ref <- alpha * trained + (1 - alpha) * ref` (alpha = 1: hard copy), the same update TRL's
  SyncRefModelCallback applies to a full reference model (TD-MPC / "ref_model_mixup_alpha").
  For factorised adapters (LoRA's B·A, LoHa, LoKr, VeRA) an EMA of the factors is not the EMA of the
  weight delta: the new LoRA delta is alpha·BA + (1-alpha)·B_ref·A_ref - alpha(1-alpha)(B-B_ref)(A-A_ref).
  Hard copies are exact.
* Under DeepSpeed ZeRO-3 the paired tensors are gathered with `GatheredParameters(modifier_rank=0)`,
  so rank 0's result is re-partitioned to every rank; tensors that are not ZeRO partitions (DDP, or
  adapters added after the engine was built) are broadcast from rank 0. Every rank ends identical.
* `ReferenceAdapterCallback` refreshes every N optimizer steps or at each epoch end, writes
  `ref_adapter.safetensors` into each checkpoint and loads it back when training resumes.

Mixable adapter types (pairing checked by `paired_parameters`, function equality after a hard copy is
tested): LoRA (incl. DoRA magnitudes and modules_to_save), LoHa, LoKr, IA3, VeRA (its shared projection
buffers are regenerated identically from the config's PRNG key), OFT, FourierFT. Not supported:
AdaLoRA (PEFT allows one trainable AdaLoRA adapter and its rank allocator masks are per adapter) and
prompt-learning methods (prefix/prompt/p-tuning have no per-layer adapter tensors to pair).
"""

from __future__ import annotations

import copy
import os
import shutil

import torch
from transformers import TrainerCallback

from grpo_hub.config.feature_checks import validate_reference_settings
from grpo_hub.training.distributed import broadcast_unpartitioned, gathered, unwrap_peft_model

REF_ADAPTER = "ref"
REF_ADAPTER_FILE = "ref_adapter.safetensors"
UNSUPPORTED_PEFT_TYPES = {
    "ADALORA": "PEFT allows a single trainable AdaLoRA adapter and its rank masks are per adapter",
}


def should_refresh_at_step(sync_on: str, sync_steps: int, global_step: int) -> bool:
    """True when a step-based schedule refreshes after optimizer step `global_step` (every `sync_steps`)."""
    return sync_on == "steps" and global_step > 0 and global_step % sync_steps == 0


def in_adapter(param_name: str, adapter: str) -> bool:
    """True when `adapter` is a whole dotted path component of `param_name` (PEFT keys tensors by adapter)."""
    return adapter in param_name.split(".")


def swap_adapter_name(param_name: str, source: str, target: str) -> str | None:
    """Replace the dotted path component `source` by `target`; None when `source` is not a component.

    `...q_proj.lora_A.default.weight` -> `...q_proj.lora_A.ref.weight`; `...hada_w1_a.default` (LoHa,
    a ParameterDict entry) -> `...hada_w1_a.ref`.
    """
    if not in_adapter(param_name, source):
        return None
    return ".".join(target if part == source else part for part in param_name.split("."))


def _full_shape(param: torch.Tensor) -> torch.Size:
    """Shape of a parameter, using DeepSpeed's `ds_shape` when ZeRO-3 has partitioned it."""
    return getattr(param, "ds_shape", param.shape)


def trained_adapter_name(model) -> str:
    """Name of the single active (trained) adapter of a PeftModel; ValueError for several or for "ref"."""
    active = model.active_adapter
    if not isinstance(active, str):
        raise ValueError(
            f"The reference adapter needs exactly one active (trained) adapter, found {active!r}."
        )
    if active == REF_ADAPTER:
        raise ValueError(
            f"The active adapter is {REF_ADAPTER!r}; activate the trained adapter before training."
        )
    return active


def check_supported_peft(model) -> None:
    """ValueError when the model is not a PeftModel or its adapter type cannot host a refreshable copy."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        raise ValueError(
            "A reference adapter needs a PEFT model (pass `peft_config` or a PeftModel). For full fine-tuning "
            "refresh the reference model with TRL's `sync_ref_model=True`, `ref_model_sync_steps` and "
            "`ref_model_mixup_alpha` instead of `ref_adapter_sync_on`."
        )
    config = model.peft_config[trained_adapter_name(model)]
    peft_type = str(getattr(config.peft_type, "value", config.peft_type))
    if peft_type in UNSUPPORTED_PEFT_TYPES:
        raise ValueError(
            f"`ref_adapter_*`: {peft_type} adapters cannot be refreshed ({UNSUPPORTED_PEFT_TYPES[peft_type]}); "
            "use LoRA/DoRA, LoHa, LoKr, IA3, VeRA, OFT or FourierFT, or set `ref_adapter_sync_on='never'`."
        )
    if config.is_prompt_learning:
        raise ValueError(
            f"`ref_adapter_*`: prompt-learning adapters ({peft_type}) have no per-layer tensors to pair with a "
            "reference copy; use a LoRA-family adapter or set `ref_adapter_sync_on='never'`."
        )


def paired_parameters(
    model, trained: str, ref: str = REF_ADAPTER
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """List (ref name, trained param, ref param) for every tensor of adapter `trained`, paired by name.

    Raises ValueError when a trained tensor has no reference partner of the same shape and dtype, or a
    reference tensor has no trained partner: such adapters cannot be copied or mixed by name.
    """
    params = dict(model.named_parameters())
    pairs, unpaired = [], []
    for name, param in params.items():
        ref_name = swap_adapter_name(name, trained, ref)
        if ref_name is None:
            continue
        ref_param = params.get(ref_name)
        if ref_param is None:
            unpaired.append(name)
        elif _full_shape(ref_param) != _full_shape(param) or ref_param.dtype != param.dtype:
            unpaired.append(
                f"{name} ({param.dtype}, {tuple(_full_shape(param))} vs {ref_param.dtype}, "
                f"{tuple(_full_shape(ref_param))})"
            )
        else:
            pairs.append((ref_name, param, ref_param))
    paired_refs = {ref_name for ref_name, _, _ in pairs}
    unpaired += [n for n in params if in_adapter(n, ref) and n not in paired_refs]
    if unpaired or not pairs:
        raise ValueError(
            f"Adapters {trained!r} and {ref!r} do not pair tensor by tensor (unpaired: {unpaired[:4]}); the "
            f"{ref!r} adapter must be created from the trained adapter's config (see add_reference_adapter)."
        )
    return pairs


def freeze_reference_adapter(model, ref: str = REF_ADAPTER) -> int:
    """Set requires_grad=False on every tensor of adapter `ref`; return how many tensors were frozen."""
    frozen = 0
    for name, param in model.named_parameters():
        if in_adapter(name, ref):
            param.requires_grad_(False)
            frozen += 1
    return frozen


def mix_(ref_tensors: list[torch.Tensor], trained_tensors: list[torch.Tensor], alpha: float) -> None:
    """In place: ref <- alpha * trained + (1 - alpha) * ref for each pair (alpha = 1 copies exactly)."""
    for ref_tensor, trained_tensor in zip(ref_tensors, trained_tensors, strict=True):
        if alpha == 1.0:
            ref_tensor.copy_(trained_tensor)
        else:
            ref_tensor.mul_(1.0 - alpha).add_(trained_tensor, alpha=alpha)


def refresh_reference_adapter(model, alpha: float = 1.0, ref: str = REF_ADAPTER) -> None:
    """Refresh adapter `ref` from the trained adapter: ref <- alpha * trained + (1 - alpha) * ref.

    Collective under DDP / DeepSpeed: call it on every rank. Every rank ends with rank 0's result.
    """
    pairs = paired_parameters(model, trained_adapter_name(model), ref)
    trained_params = [t for _, t, _ in pairs]
    ref_params = [r for _, _, r in pairs]
    with torch.no_grad():
        with gathered(trained_params + ref_params, modifier_rank=0):
            mix_([r.data for r in ref_params], [t.data for t in trained_params], alpha)
        broadcast_unpartitioned(ref_params)


def match_trained_dtypes(model, trained: str, ref: str = REF_ADAPTER) -> int:
    """Cast each tensor of the newly added adapter `ref` to the dtype of its trained partner; return how many.

    PEFT's `add_adapter` upcasts a new adapter to float32 (`autocast_adapter_dtype=True`), while TRL builds
    the trained adapter with `autocast_adapter_dtype=False` under DeepSpeed ZeRO-3 (trl#6089), so with bf16
    the trained LoRA factors stay bf16 and the two adapters would not pair. Only for tensors that ZeRO has
    not partitioned yet (the adapter is added before the engine is built).
    """
    params = dict(model.named_parameters())
    cast = 0
    for name, param in params.items():
        ref_param = params.get(swap_adapter_name(name, trained, ref) or "")
        if ref_param is not None and ref_param.dtype != param.dtype and not hasattr(ref_param, "ds_id"):
            ref_param.data = ref_param.data.to(param.dtype)
            cast += 1
    return cast


def rng_left_alone(model):
    """Context in which random draws do not advance the global CPU / CUDA generators of `model`'s devices.

    Building the "ref" adapter draws its (immediately overwritten) initial values; without this, every later
    completion of a run with `ref_adapter_keep` or a refresh schedule differed from TRL's before the reference
    had changed anything (issue 32).
    """
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    return torch.random.fork_rng(devices=cuda)


def add_reference_adapter(model, ref: str = REF_ADAPTER) -> bool:
    """Ensure `model` (a PeftModel) holds a frozen adapter `ref` equal to the trained adapter.

    Adds it from a copy of the trained adapter's config (inference_mode=True) and copies the weights;
    when it already exists (TRL makes one for a wrapped PeftModel) it is only frozen and checked.
    The active adapter is left unchanged. Returns True when the adapter was added here.
    """
    check_supported_peft(model)
    trained = trained_adapter_name(model)
    added = ref not in model.peft_config
    if added:
        ref_config = copy.deepcopy(model.peft_config[trained])
        ref_config.inference_mode = True
        # PEFT draws the new adapter's initial values (replaced by the copy below) without touching the RNG
        with rng_left_alone(model):
            model.add_adapter(ref, ref_config)  # PEFT keeps the active adapter and its trainable flags
        match_trained_dtypes(model, trained, ref)
    freeze_reference_adapter(model, ref)
    paired_parameters(model, trained, ref)
    if added:
        refresh_reference_adapter(model, alpha=1.0, ref=ref)
    return added


def reference_state_dict(model, ref: str = REF_ADAPTER) -> dict[str, torch.Tensor]:
    """Full (gathered) CPU copies of the `ref` adapter tensors, keyed by parameter name. Collective."""
    pairs = paired_parameters(model, trained_adapter_name(model), ref)
    ref_params = [r for _, _, r in pairs]
    with gathered(ref_params):
        return {name: r.detach().to("cpu", copy=True).contiguous() for name, _, r in pairs}


def load_reference_state_dict(model, state: dict[str, torch.Tensor], ref: str = REF_ADAPTER) -> None:
    """Copy `state` (from `reference_state_dict`) into the `ref` adapter on every rank. Collective."""
    pairs = paired_parameters(model, trained_adapter_name(model), ref)
    missing = sorted({name for name, _, _ in pairs} ^ set(state))
    if missing:
        raise ValueError(f"Saved reference adapter does not match the model's {ref!r} adapter: {missing[:4]}")
    ref_params = [r for _, _, r in pairs]
    with torch.no_grad(), gathered(ref_params, modifier_rank=0):
        for name, _, r in pairs:
            r.data.copy_(state[name].to(r.data.device, r.data.dtype))


def save_reference_adapter(model, folder: str, global_step: int, is_main_process: bool) -> None:
    """Write the gathered `ref` adapter to `<folder>/ref_adapter.safetensors` (rank 0 writes). Collective."""
    from safetensors.torch import save_file

    state = reference_state_dict(model)
    if is_main_process:
        os.makedirs(folder, exist_ok=True)
        save_file(state, os.path.join(folder, REF_ADAPTER_FILE), metadata={"global_step": str(global_step)})


def load_reference_adapter(model, folder: str, global_step: int) -> None:
    """Load `<folder>/ref_adapter.safetensors` into the `ref` adapter; ValueError if it is for another step."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = os.path.join(folder, REF_ADAPTER_FILE)
    with safe_open(path, framework="pt") as handle:
        saved_step = int((handle.metadata() or {}).get("global_step", -1))
    if saved_step != global_step:
        raise ValueError(
            f"{path} was saved at step {saved_step}, but training resumes at step {global_step}."
        )
    load_reference_state_dict(model, load_file(path))


def strip_reference_adapter(output_dir: str, ref: str = REF_ADAPTER) -> bool:
    """Delete the `<output_dir>/<ref>/` adapter folder PEFT's save_pretrained writes; True if removed."""
    folder = os.path.join(output_dir, ref)
    if not os.path.isfile(os.path.join(folder, "adapter_config.json")):
        return False
    shutil.rmtree(folder)
    return True


def resume_folder(
    args, global_step: int, explicit: str | None = None, filename: str = REF_ADAPTER_FILE
) -> str | None:
    """Checkpoint folder to restore `filename` (default: the reference) from: `explicit` (the path given to
    `trainer.train()`) or `args.resume_from_checkpoint` when it is a path holding the file, else
    `<output_dir>/checkpoint-<global_step>` (where Trainer saves); None if absent."""
    candidates = [
        explicit,
        getattr(args, "resume_from_checkpoint", None),
        os.path.join(args.output_dir, f"checkpoint-{global_step}"),
    ]
    for folder in candidates:
        if isinstance(folder, str) and os.path.isfile(os.path.join(folder, filename)):
            return folder
    return None


class ReferenceAdapterCallback(TrainerCallback):
    """Refresh the frozen "ref" adapter on schedule, save it in checkpoints and restore it on resume.

    `sync_on`: "never" (only checkpointed), "steps" (after every `sync_steps` optimizer steps) or
    "epoch" (at each epoch end). `mixup_alpha`: 1.0 hard copy, < 1 EMA. All hooks run on every rank.
    """

    def __init__(self, sync_on: str = "steps", sync_steps: int = 64, mixup_alpha: float = 1.0):
        validate_reference_settings(
            sync_on, sync_steps, mixup_alpha, beta=1.0, sync_ref_model=False, keep=True
        )
        self.sync_on = sync_on
        self.sync_steps = sync_steps
        self.mixup_alpha = mixup_alpha
        self.refreshed_at: list[int] = []
        self.resume_from: str | None = None  # set by GRPOHubTrainer.train(resume_from_checkpoint=<path>)

    def _refresh(self, model, global_step: int) -> None:
        refresh_reference_adapter(unwrap_peft_model(model), self.mixup_alpha)
        self.refreshed_at.append(global_step)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        """Check the ref adapter is frozen and paired; when resuming, load the checkpoint's reference."""
        peft_model = unwrap_peft_model(model)
        check_supported_peft(peft_model)
        if REF_ADAPTER not in peft_model.peft_config:
            raise ValueError(
                f"The model has no {REF_ADAPTER!r} adapter; call add_reference_adapter(model) first."
            )
        freeze_reference_adapter(peft_model)
        paired_parameters(peft_model, trained_adapter_name(peft_model))
        if state.global_step > 0:
            folder = resume_folder(args, state.global_step, self.resume_from)
            if folder is None:
                raise ValueError(
                    f"Resuming at step {state.global_step} but no {REF_ADAPTER_FILE} was found in "
                    f"the resumed checkpoint or {args.output_dir}/checkpoint-{state.global_step}; the reference "
                    "adapter would silently restart from its initial value. Fix: resume from a checkpoint saved "
                    "with the reference adapter (GRPOHubTrainer writes it), passing its folder to "
                    "`trainer.train(resume_from_checkpoint=...)`."
                )
            load_reference_adapter(peft_model, folder, state.global_step)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        """Refresh after every `sync_steps` optimizer steps when `sync_on == "steps"`."""
        if should_refresh_at_step(self.sync_on, self.sync_steps, state.global_step):
            self._refresh(model, state.global_step)

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        """Refresh at each epoch end when `sync_on == "epoch"`."""
        if self.sync_on == "epoch":
            self._refresh(model, state.global_step)

    def on_save(self, args, state, control, model=None, **kwargs):
        """Write the reference into the checkpoint folder Trainer just saved (`checkpoint-<step>`).

        PEFT's duplicate `ref/` folder is removed from the checkpoint: the reference is stored once, and
        restored by `on_train_begin` for DDP and DeepSpeed alike (transformers reloads `ref/` only
        without DeepSpeed; under ZeRO-3 the frozen adapter would silently keep its initial value).
        """
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        save_reference_adapter(
            unwrap_peft_model(model), folder, state.global_step, state.is_world_process_zero
        )
        if state.is_world_process_zero:
            strip_reference_adapter(folder)


def attach_reference_adapter(trainer) -> ReferenceAdapterCallback | None:
    """Wire the reference adapter into a built GRPOHubTrainer (called at the end of its __init__).

    With `ref_adapter_keep` or a refresh schedule, adds the frozen "ref" adapter (ValueError without
    PEFT). Whenever the model then has a "ref" adapter (also TRL's own, made for a wrapped PeftModel),
    registers a `ReferenceAdapterCallback` so checkpoints carry it and a resume restores it. Runs before
    `train()` builds the DDP / DeepSpeed engine, so ZeRO-3 partitions the new adapter like the others.
    FSDP is not supported (its sharded DTensors are neither gathered nor broadcast here): asking for the
    reference adapter under FSDP is a ValueError, and TRL's own "ref" is then left as TRL handles it.
    """
    args = trainer.args
    fsdp = getattr(trainer, "is_fsdp_enabled", False)
    if args.uses_reference_adapter:
        if fsdp:
            raise ValueError(
                "`ref_adapter_sync_on` / `ref_adapter_keep`: the reference adapter supports DDP and DeepSpeed "
                "ZeRO-2/3, not FSDP. Fix: use a DeepSpeed accelerate config, or turn the reference adapter off."
            )
        add_reference_adapter(trainer.model)
    elif fsdp or REF_ADAPTER not in getattr(trainer.model, "peft_config", {}):
        return None
    callback = ReferenceAdapterCallback(
        args.ref_adapter_sync_on, args.ref_adapter_sync_steps, args.ref_adapter_mixup_alpha
    )
    trainer.add_callback(callback)
    return callback
