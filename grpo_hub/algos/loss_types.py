"""The loss types GRPOHubConfig accepts, each described once: what its normaliser averages over, its surrogate,
and which path computes it. Plain data; the config's checks and presets and both loss paths read it.

Normalisers (what one micro-batch's loss is divided by, TRL 1.16 `GRPOTrainer._compute_loss`):
- ROWS: a mean over the rows of the micro-batch (grpo/gspo: per-row token mean, then row mean; sapo likewise;
  dr_grpo: token sum / max_completion_length, row mean; luspo: token sum, row mean). Pad rows added by
  filtering would dilute the mean, so a filtered batch is rescaled to the normaliser's row count.
- MICRO_TOKENS: the loss tokens of the micro-batch (bnpo): the loss depends on which rows share a micro-batch.
- BATCH_TOKENS: the loss tokens of the whole generation batch on all ranks (`num_items_in_batch`: dapo, cispo,
  vespo), independent of how rows fall into micro-batches.
A `loss_agg_mode` replaces the normaliser (own loss path): token-mean is BATCH_TOKENS, the seq-mean modes ROWS.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_hub.algos.losses import SEQ_MEAN_AGG_MODES

ROWS, MICRO_TOKENS, BATCH_TOKENS = "rows", "micro_tokens", "batch_tokens"
NORMALIZERS = (ROWS, MICRO_TOKENS, BATCH_TOKENS)


@dataclass(frozen=True)
class LossType:
    """One `loss_type` value: the TRL loss it runs and the properties the other features depend on."""

    name: str
    trl_loss_type: str  # what TRL's `_compute_loss` runs (a preset resolves onto a TRL loss type)
    normalizer: str  # ROWS, MICRO_TOKENS or BATCH_TOKENS (module docstring)
    surrogate: str  # "clip" (PPO clip: dual-clip applies), "cispo", "soft" (SAPO), "vespo"
    # the loss_agg_mode equal to its normaliser, when the own loss path can compute this loss type
    own_path_agg: str | None = None
    sequence_level: bool = False  # a preset of importance_sampling_level='sequence'
    clip_range: tuple[float, float] | None = None  # a preset's (epsilon, epsilon_high) unless either is given
    default_epsilon_high: float | None = None  # epsilon_high when unset (TRL's default would be epsilon)
    source: str = ""

    @property
    def is_preset(self) -> bool:
        return self.name != self.trl_loss_type


REGISTRY = {
    t.name: t
    for t in (
        LossType("grpo", "grpo", ROWS, "clip", "seq-mean-token-mean", source="DeepSeekMath arXiv:2402.03300"),
        LossType("dr_grpo", "dr_grpo", ROWS, "clip", source="Dr. GRPO arXiv:2503.20783"),
        LossType("dapo", "dapo", BATCH_TOKENS, "clip", "token-mean", source="DAPO arXiv:2503.14476"),
        LossType("bnpo", "bnpo", MICRO_TOKENS, "clip", source="TRL 1.16 (batch-normalised token mean)"),
        LossType(
            "cispo",
            "cispo",
            BATCH_TOKENS,
            "cispo",  # epsilon_high is an ABSOLUTE ratio cap; TRL's default (= epsilon, 0.2) caps every ratio
            "token-mean",
            default_epsilon_high=5.0,  # ScaleRL's recommended cap
            source="MiniMax-M1 arXiv:2506.13585",
        ),
        LossType("sapo", "sapo", ROWS, "soft", source="SAPO (TRL 1.16)"),
        LossType("luspo", "luspo", ROWS, "clip", source="LUSPO (TRL 1.16)"),
        LossType("vespo", "vespo", BATCH_TOKENS, "vespo", source="VESPO (TRL 1.16)"),
        LossType(
            "gspo",
            "grpo",
            ROWS,
            "clip",
            "seq-mean-token-mean",
            sequence_level=True,
            clip_range=(3e-4, 4e-4),  # GSPO paper, section 5.1
            source="GSPO arXiv:2507.18071",
        ),
    )
}
NAMES = tuple(REGISTRY)
TRL_NAMES = tuple(name for name, t in REGISTRY.items() if t.trl_loss_type == name)
OWN_PATH_NAMES = tuple(name for name, t in REGISTRY.items() if t.own_path_agg is not None)


def loss_normalizer(loss_type: str, loss_agg_mode: str | None) -> str:
    """What the loss of one micro-batch is divided by (ROWS, MICRO_TOKENS or BATCH_TOKENS).

    `loss_type` is a registry name (a preset or its resolved TRL name: both have the same normaliser);
    `loss_agg_mode`, when set, replaces the loss type's own normaliser (token-mean: BATCH_TOKENS, else ROWS).
    """
    if loss_agg_mode is not None:
        return ROWS if loss_agg_mode in SEQ_MEAN_AGG_MODES else BATCH_TOKENS
    return REGISTRY[loss_type].normalizer


def own_path_agg_mode(loss_type: str, loss_agg_mode: str | None) -> str:
    """The aggregation the own loss path runs: `loss_agg_mode`, else the loss type's own normaliser as a mode."""
    return loss_agg_mode or REGISTRY[loss_type].own_path_agg
