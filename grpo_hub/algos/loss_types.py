"""The loss types GRPOHubConfig accepts, each one entry that holds its behaviour: its surrogate (a registered
function with its metrics, `grpo_hub.algos.surrogates`), what its loss is divided by, which path computes it, its
presets and its citation. The config's checks and presets, both loss paths, the run record and the model card read
the entry. Adding a loss type is one entry (and, for a new surrogate, one registered function).

Denominators (what one micro-batch's loss is divided by, TRL 1.16 `GRPOTrainer._compute_loss`):
- ROWS: a mean over the rows of the micro-batch (grpo/gspo: per-row token mean, then row mean; sapo likewise;
  dr_grpo: token sum / max_completion_length, row mean; luspo: token sum, row mean). Pad rows added by
  filtering would dilute the mean, so a filtered batch is rescaled to the denominator's row count.
- MICRO_TOKENS: the loss tokens of the micro-batch (bnpo): the loss depends on which rows share a micro-batch.
- BATCH_TOKENS: the loss tokens of the whole generation batch on all ranks (`num_items_in_batch`: dapo, cispo,
  vespo), independent of how rows fall into micro-batches.
A `loss_agg_mode` replaces the denominator (own loss path): token-mean is BATCH_TOKENS, the seq-mean modes ROWS.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_hub.algos import citations
from grpo_hub.algos.losses import SEQ_MEAN_AGG_MODES
from grpo_hub.algos.surrogates import SURROGATES, Surrogate

ROWS, MICRO_TOKENS, BATCH_TOKENS = "rows", "micro_tokens", "batch_tokens"
DENOMINATORS = (ROWS, MICRO_TOKENS, BATCH_TOKENS)


@dataclass(frozen=True)
class LossType:
    """One `loss_type` value: the TRL loss it runs and the properties the other features depend on."""

    name: str
    trl_loss_type: str  # what TRL's `_compute_loss` runs (a preset resolves onto a TRL loss type)
    denominator: str  # ROWS, MICRO_TOKENS or BATCH_TOKENS (module docstring)
    surrogate: Surrogate
    # the loss_agg_mode equal to its denominator, when the own loss path can compute this loss type
    own_path_agg: str | None = None
    sequence_level: bool = False  # a preset of importance_sampling_level='sequence'
    clip_range: tuple[float, float] | None = None  # a preset's (epsilon, epsilon_high) unless either is given
    default_epsilon_high: float | None = None  # epsilon_high when unset (TRL's default would be epsilon)
    source: str = ""
    citation: str | None = None  # BibTeX, cited by the model card

    @property
    def is_preset(self) -> bool:
        return self.name != self.trl_loss_type


REGISTRY = {
    t.name: t
    for t in (
        LossType(
            "grpo",
            "grpo",
            ROWS,
            SURROGATES["clip"],
            "seq-mean-token-mean",
            source="DeepSeekMath arXiv:2402.03300",
            citation=citations.DEEPSEEKMATH,
        ),
        LossType(
            "dr_grpo",
            "dr_grpo",
            ROWS,
            SURROGATES["clip"],
            source="Dr. GRPO arXiv:2503.20783",
            citation=citations.DR_GRPO,
        ),
        LossType(
            "dapo",
            "dapo",
            BATCH_TOKENS,
            SURROGATES["clip"],
            "token-mean",
            source="DAPO arXiv:2503.14476",
            citation=citations.DAPO,
        ),
        LossType(
            "bnpo", "bnpo", MICRO_TOKENS, SURROGATES["clip"], source="TRL 1.16 (batch-normalised token mean)"
        ),
        LossType(
            "cispo",
            "cispo",
            BATCH_TOKENS,
            SURROGATES[
                "cispo"
            ],  # epsilon_high: an ABSOLUTE cap; TRL's default (= epsilon, 0.2) caps every ratio
            "token-mean",
            default_epsilon_high=5.0,  # ScaleRL's recommended cap
            source="MiniMax-M1 arXiv:2506.13585",
            citation=citations.CISPO,
        ),
        LossType("sapo", "sapo", ROWS, SURROGATES["soft"], source="SAPO (TRL 1.16)"),
        LossType("luspo", "luspo", ROWS, SURROGATES["clip"], source="LUSPO (TRL 1.16)"),
        LossType("vespo", "vespo", BATCH_TOKENS, SURROGATES["vespo"], source="VESPO (TRL 1.16)"),
        LossType(
            "gspo",
            "grpo",
            ROWS,
            SURROGATES["clip"],
            "seq-mean-token-mean",
            sequence_level=True,
            clip_range=(3e-4, 4e-4),  # GSPO paper, section 5.1
            source="GSPO arXiv:2507.18071",
            citation=citations.GSPO,
        ),
    )
}
NAMES = tuple(REGISTRY)
TRL_NAMES = tuple(name for name, t in REGISTRY.items() if t.trl_loss_type == name)
OWN_PATH_NAMES = tuple(name for name, t in REGISTRY.items() if t.own_path_agg is not None)


def denominator_kind(loss_type: str, loss_agg_mode: str | None) -> str:
    """What the loss of one micro-batch is divided by (ROWS, MICRO_TOKENS or BATCH_TOKENS).

    `loss_type` is a registry name (a preset or its resolved TRL name: both have the same denominator);
    `loss_agg_mode`, when set, replaces the loss type's own denominator (token-mean: BATCH_TOKENS, else ROWS).
    """
    if loss_agg_mode is not None:
        return ROWS if loss_agg_mode in SEQ_MEAN_AGG_MODES else BATCH_TOKENS
    return REGISTRY[loss_type].denominator


def own_path_agg_mode(loss_type: str, loss_agg_mode: str | None) -> str:
    """The aggregation the own loss path runs: `loss_agg_mode`, else the loss type's own denominator as a mode."""
    return loss_agg_mode or REGISTRY[loss_type].own_path_agg


def variant_name(loss_type: str, importance_sampling_level: str | None) -> str:
    """The registry entry a resolved config trains: the sequence-level preset of its TRL loss type (gspo), else
    the loss type itself."""
    if importance_sampling_level == "sequence":
        for entry in REGISTRY.values():
            if entry.is_preset and entry.sequence_level and entry.trl_loss_type == loss_type:
                return entry.name
    return loss_type
