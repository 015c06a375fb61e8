"""A stand-in for vLLM's sampler on the main environment: TRL's vLLM importance-sampling (IS) path, exercised
without vLLM.

`as_vllm_sampler(trainer)` flips a trainer built without vLLM onto TRL's vLLM code path: completions still come
from HF generate, and each token gets a sampler log-prob as vLLM would report it: the policy's own log-prob at
generation time (a no-grad forward, which `ScoringForwards` does not count, as it does not count generation's), moved by a deterministic
per-token offset (no random number drawn, so the training's random stream is untouched), NaN on some tokens (vLLM
reports None there). TRL's scoring forward and IS ratio then run exactly as under vLLM; the real-vLLM tests in
tests/training/vllm check the same against a served model.
"""

from __future__ import annotations

import math

import torch
from trl.trainer.utils import pad

from grpo_hub.config.vllm_checks import scoring_forward_reason

OFFSET = 0.05  # |log π_sampler - log π_trainer| of the stand-in, at most


def sampler_offset(token: int, position: int) -> float | None:
    """The stand-in's sampler log-prob minus the policy's for `token` at `position`; None (vLLM's NaN) on some."""
    if (token + position) % 11 == 0:
        return None
    return OFFSET * math.sin(12.9898 * token + 78.233 * position)


class ScoringForwards:
    """Counts the policy's no-grad forwards (TRL's scoring forward, and any other) while not `paused` (the stand-in's
    generation pauses it, and `pause_during` does around another call)."""

    def __init__(self, model):
        self.count, self.paused = 0, False
        model.register_forward_pre_hook(self._count)

    def _count(self, module, args):
        if not torch.is_grad_enabled() and not self.paused:
            self.count += 1

    def pause_during(self, owner, name: str) -> None:
        """Count nothing while `owner.<name>()` runs (e.g. a probe's forwards, wrapped around a weight sync)."""
        method = getattr(owner, name)

        def paused(*args, **kwargs):
            self.paused = True
            try:
                return method(*args, **kwargs)
            finally:
                self.paused = False

        setattr(owner, name, paused)


def as_vllm_sampler(
    trainer,
    forwards: ScoringForwards,
    *,
    loss_time: bool,
    mode="sequence_mask",
    low=None,
    high=3.0,
    pooling=None,
) -> None:
    """Run `trainer` (built with use_vllm=False) on TRL's vLLM IS path with TRL's `vllm_importance_sampling_mode`
    `mode`, clip bounds `low` / `high` and grpo_hub's `vllm_is_pooling` `pooling` (set here: a config refuses them
    without vLLM). With `loss_time`, a GRPOHubTrainer takes the ratio from the training forward where the production
    rule allows it (`scoring_forward_reason`); else TRL's scoring forward computes it."""
    generate = trainer._generate

    def generate_as_vllm(prompts):
        trainer.use_vllm, forwards.paused = False, True  # HF generate, whose forwards are the sampler's
        try:
            out = list(generate(prompts))
            out[4] = sampler_logprobs(trainer, out[0], out[1])
        finally:
            trainer.use_vllm, forwards.paused = True, False
        return tuple(out)

    trainer._generate = generate_as_vllm
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer.vllm_importance_sampling_mode = mode
    trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max = low, high
    if hasattr(trainer, "_use_loss_time_is"):  # grpo_hub
        trainer.args.vllm_is_pooling = pooling
        trainer._use_loss_time_is(loss_time and scoring_forward_reason(trainer.args) is None)


def sampler_logprobs(trainer, prompt_ids: list, completion_ids: list) -> list[list[float | None]]:
    """Per row, per completion token: the policy's log-prob + `sampler_offset` (None where vLLM would give NaN)."""
    device = trainer.accelerator.device
    pad_id = trainer._tokenizer.pad_token_id
    prompts = pad([torch.tensor(p) for p in prompt_ids], padding_value=pad_id, padding_side="left")
    prompt_mask = pad(
        [torch.ones(len(p), dtype=torch.long) for p in prompt_ids], padding_value=0, padding_side="left"
    )
    width = max(1, max(len(c) for c in completion_ids))
    completions = torch.full((len(completion_ids), width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros_like(completions)
    for row, ids in enumerate(completion_ids):
        completions[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        completion_mask[row, : len(ids)] = 1
    ids = torch.cat([prompts, completions], dim=1).to(device)
    mask = torch.cat([prompt_mask, completion_mask], dim=1).to(device)
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width)[0].cpu()
    out = []
    for row, tokens in enumerate(completion_ids):
        offsets = [sampler_offset(t, i) for i, t in enumerate(tokens)]
        out.append([None if o is None else float(logps[row, i]) + o for i, o in enumerate(offsets)])
    return out
