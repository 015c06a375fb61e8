"""GRPOHubConfig: `trl.GRPOConfig` plus the grpo_hub features, each off by default.

With every new field at its default the config is exactly a `trl.GRPOConfig`. Fields are grouped by feature;
each group has a `_validate_<feature>()` method called from `__post_init__`, and every invalid value raises a
ValueError that names the field and the fix. Checks common to all fields run first (`_validate_values`): every
field declared here has its annotated type and, if a float, is finite (None turns a bound off, never `inf`); no
float field of the config (TRL's included) is NaN; and a field set explicitly -- its value differs from its
default -- whose switch is off (`EFFECT_NEEDS`) is an error, since it would have no effect. A value equal to the
default cannot be told apart from an unset one and is accepted.
"""

import dataclasses
import inspect
import math
from dataclasses import dataclass, field

from trl import GRPOConfig

from grpo_hub.algos import advantages, importance, losses, selection
from grpo_hub.training.compat import check_trl_version
from grpo_hub.training.reference import validate_reference_settings
from grpo_hub.training.validation import check_effect, check_finite, check_type, field_error
from grpo_hub.training.vllm_checks import AGILERL_TOKEN_CAP, check_sampler_matches_trainer, resolve_vllm_is

check_trl_version()

TRL_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
LOSS_TYPES = (*TRL_LOSS_TYPES, "gspo")
# Clipped-surrogate losses that the own loss path computes (the loss_type then only picks the surrogate).
OWN_PATH_LOSS_TYPES = ("grpo", "dapo", "cispo")
ZERO_SIGNAL_NORMALIZERS = ("kept", "all")
# TRL losses that average over the rows of a micro-batch ("gspo" resolves to "grpo"): pad rows would dilute them.
ROW_MEAN_LOSSES = ("grpo", "gspo", "sapo", "luspo", "dr_grpo")
DYNAMIC_SAMPLING_ON_CAP = ("train", "error")

# A field set away from its default has an effect only when its switch is on: field -> (switch, predicate).
EFFECT_NEEDS = {
    "zero_signal_eps": (
        "filter_zero_signal=True, dynamic_sampling=True or selective_rollout=True",
        lambda c: c.filter_zero_signal or c.dynamic_sampling or c.selective_rollout,
    ),
    "zero_signal_normalizer": (
        "filter_zero_signal=True or dynamic_sampling=True",
        lambda c: c.filter_zero_signal or c.dynamic_sampling,
    ),
    "zero_signal_pack": (
        "filter_zero_signal=True or dynamic_sampling=True",
        lambda c: c.filter_zero_signal or c.dynamic_sampling,
    ),
    "dynamic_sampling_target_groups": ("dynamic_sampling=True", lambda c: c.dynamic_sampling),
    "dynamic_sampling_max_rounds": ("dynamic_sampling=True", lambda c: c.dynamic_sampling),
    "dynamic_sampling_on_cap": ("dynamic_sampling=True", lambda c: c.dynamic_sampling),
    "reward_shift": ("reward_norm='batch' or 'running'", lambda c: c.reward_norm is not None),
    "reward_scale": ("reward_norm='batch' or 'running'", lambda c: c.reward_norm is not None),
    "vllm_is_pooling": (
        "use_vllm=True and vllm_importance_sampling_correction=True",
        lambda c: c.use_vllm and c.vllm_importance_sampling_correction,
    ),
    "vllm_is_preset": (
        "use_vllm=True and vllm_importance_sampling_correction=True",
        lambda c: c.use_vllm and c.vllm_importance_sampling_correction,
    ),
    "ref_adapter_sync_steps": ("ref_adapter_sync_on='steps'", lambda c: c.ref_adapter_sync_on == "steps"),
    "ref_adapter_mixup_alpha": (
        "ref_adapter_sync_on='steps' or 'epoch'",
        lambda c: c.ref_adapter_sync_on != "never",
    ),
    "ref_adapter_save": ("beta > 0 (without a KL term there is no 'ref' adapter)", lambda c: c.beta != 0.0),
    **{
        f"selective_rollout_{name}": ("selective_rollout=True", lambda c: c.selective_rollout)
        for name in (
            "id_column",
            "target_zero_frac",
            "explore_init",
            "explore_step",
            "min_keep_prob",
            "reward_min",
            "reward_max",
        )
    },
}
# TRL bounds that grpo_hub's checks compare against: finite, or None for TRL's default / off.
FINITE_TRL_BOUNDS = ("epsilon_high", "delta")

TRL_EPSILON = 0.2
GSPO_EPSILON, GSPO_EPSILON_HIGH = 3e-4, 4e-4  # GSPO paper, section 5.1
CISPO_EPSILON_HIGH = 5.0  # ScaleRL paper's recommended CISPO cap


@dataclass
class GRPOHubConfig(GRPOConfig):
    """`trl.GRPOConfig` with grpo_hub's extra GRPO-family options (each field: docs/config-reference.md)."""

    # --- Parent fields whose defaults are resolved in __post_init__ (None = "not set by the user") ---
    loss_type: str = field(
        default="dapo",
        metadata={
            "help": "TRL's loss types ('grpo', 'dr_grpo', 'dapo' (default), 'bnpo', 'cispo', 'sapo', 'luspo', "
            "'vespo') plus the preset 'gspo' = 'grpo' with importance_sampling_level='sequence' and, unless "
            "epsilon/epsilon_high are set, the GSPO paper's clip ranges epsilon=3e-4, epsilon_high=4e-4. "
            "'cispo' without epsilon_high sets the recommended cap epsilon_high=5.0."
        },
    )
    epsilon: float | None = field(
        default=None,
        metadata={"help": "Lower clip epsilon. None: TRL's 0.2, or 3e-4 with loss_type='gspo'."},
    )
    importance_sampling_level: str | None = field(
        default=None,
        metadata={
            "help": "'token', 'sequence' (GSPO), or 'turn': the log-ratio is averaged over each assistant turn "
            "of a multi-turn tool-calling rollout (turns are split by the tool-output tokens). None: 'token', "
            "or 'sequence' with loss_type='gspo'."
        },
    )

    # --- Surrogate and loss aggregation ---
    dual_clip_c: float | None = field(
        default=None,
        metadata={
            "help": "Dual-clip constant c (Ye et al. 2020): for negative advantages the per-token loss is capped at "
            "c*|A|. Must be > 1 + epsilon_high; mapped onto TRL's `delta`, which equals dual-clip in that range. "
            "None: off."
        },
    )
    loss_agg_mode: str | None = field(
        default=None,
        metadata={
            "help": "Loss aggregation (ROLL/verl): 'token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean', "
            "'seq-mean-token-sum-norm' (token sum / max_completion_length, mean over sequences). Replaces the "
            "normaliser of loss_type 'grpo'/'gspo'/'dapo'/'cispo'. None: the loss_type's own normaliser."
        },
    )

    # --- Rewards (applied to each reward function's output before advantages) ---
    reward_clip: float | None = field(
        default=None, metadata={"help": "Clip every reward to [-reward_clip, reward_clip]. None: off."}
    )
    reward_norm: str | None = field(
        default=None,
        metadata={
            "help": "Normalise rewards by 'batch' statistics or 'running' statistics over training. None: off."
        },
    )
    reward_shift: bool = field(
        default=False, metadata={"help": "With reward_norm: only subtract the mean (no division by the std)."}
    )
    reward_scale: bool = field(
        default=False, metadata={"help": "With reward_norm: only divide by the std (no mean subtraction)."}
    )
    token_level_kl_coef: float = field(
        default=0.0,
        metadata={
            "help": "KL in the reward (verl's use_kl_in_reward, GRPO form): each completion's reward becomes "
            "r - coef * sum_t (log pi_old(y_t) - log pi_ref(y_t)) over its loss tokens, before the group "
            "advantage. Independent of `beta` (KL in the loss). 0.0: off."
        },
    )

    # --- Advantages ---
    adv_norm: str | None = field(
        default=None,
        metadata={
            "help": "Group advantage: 'mean_std' (r - mean) / std, std over scale_rewards' scope ('group' or "
            "'batch'); 'mean_only' (r - mean, sets scale_rewards='none'); 'none' (raw reward, no baseline). "
            "None: TRL's scale_rewards decides."
        },
    )
    whiten_advantages: bool = field(
        default=False,
        metadata={
            "help": "Whiten the advantages over the whole generation batch (all ranks): (A - mean) / std."
        },
    )
    adv_clip_range: float | None = field(
        default=None, metadata={"help": "Clip advantages to [-adv_clip_range, adv_clip_range]. None: off."}
    )

    # --- Zero-signal filtering ---
    filter_zero_signal: bool = field(
        default=False,
        metadata={
            "help": "Drop the rows of groups whose rewards do not vary (max - min <= zero_signal_eps) before the "
            "training forward/backward, so they cost no compute. Ranks agree on a common row count and pad with "
            "masked, zero-advantage rows."
        },
    )
    zero_signal_eps: float = field(
        default=0.0, metadata={"help": "A group is zero-signal when its reward spread max - min is <= this."}
    )
    zero_signal_normalizer: str = field(
        default="kept",
        metadata={
            "help": "Loss normaliser under filtering. 'kept' (DAPO): tokens/rows that are trained, so the loss is a "
            "mean over the kept rows. 'all': the normaliser of the unfiltered batch, which keeps TRL's gradient "
            "exactly (dropped rows would have contributed zero)."
        },
    )

    zero_signal_pack: bool | None = field(
        default=None,
        metadata={
            "help": "Under filtering, pack the kept rows into as few micro-steps of per_device_train_batch_size rows "
            "as possible (all ranks agree) and run no forward/backward for the micro-steps left empty; rows stay "
            "in their optimizer step, so the gradient is unchanged. None: on whenever filtering is on and the loss "
            "does not depend on micro-batch composition (not bnpo, not top_entropy_quantile < 1). True: required "
            "(error when it cannot apply). False: every micro-step runs, thinner (the pre-packing behaviour)."
        },
    )

    # --- Dynamic sampling (DAPO; grpo_hub/dynamic_sampling.py) ---
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO dynamic sampling: while the generation batch holds fewer than dynamic_sampling_target_groups "
            "informative groups (reward spread > zero_signal_eps), generate the next generation batch of prompts from "
            "the training dataloader and add it, at most dynamic_sampling_max_rounds times; then train on the first "
            "target informative groups. Implies filter_zero_signal. One optimizer step consumes 1 + rounds "
            "generation batches, so an epoch has fewer steps (see docs/dynamic-sampling.md)."
        },
    )
    dynamic_sampling_target_groups: int | None = field(
        default=None,
        metadata={
            "help": "Informative groups (all ranks together) each generation batch trains on. None: the groups of one "
            "generation batch, generation_batch_size / num_generations."
        },
    )
    dynamic_sampling_max_rounds: int = field(
        default=4,
        metadata={
            "help": "Extra generation rounds at most per generation batch (0 = plain zero-signal filtering)."
        },
    )
    dynamic_sampling_on_cap: str = field(
        default="train",
        metadata={
            "help": "When the rounds run out short of the target: 'train' on the informative groups collected (metric "
            "dynamic/cap_hit), or 'error' (raise, as verl does)."
        },
    )

    # --- Selective rollout (GRESO; grpo_hub/algos/selection.py, grpo_hub/training/selective_rollout.py) ---
    selective_rollout: bool = field(
        default=False,
        metadata={
            "help": "GRESO pre-rollout filtering: before a generation batch is generated, skip each prompt whose last "
            "z scorings were all zero-signal of one kind (all-max or all-min reward) with probability "
            "1 - max(p_kind^z, selective_rollout_min_keep_prob), and replace it with the next prompts of the epoch, "
            "so the batch keeps its size. p_kind adapts toward selective_rollout_target_zero_frac. See "
            "docs/selective-rollout.md."
        },
    )
    selective_rollout_id_column: str | None = field(
        default=None,
        metadata={
            "help": "Dataset column holding a stable prompt id for the history. None: a hash of the prompt."
        },
    )
    selective_rollout_target_zero_frac: float = field(
        default=0.25,
        metadata={
            "help": "GRESO's target fraction of zero-signal groups among generated groups (one third all-max, two "
            "thirds all-min): above its target a kind's exploration probability drops by "
            "selective_rollout_explore_step (more skipping), below it rises; clamped to [0.05, 0.95]."
        },
    )
    selective_rollout_explore_init: float = field(
        default=0.5,
        metadata={"help": "Initial exploration probability p of both kinds, in [0.05, 0.95]."},
    )
    selective_rollout_explore_step: float = field(
        default=0.01,
        metadata={"help": "Change of an exploration probability per scored generation batch (GRESO: 0.01)."},
    )
    selective_rollout_min_keep_prob: float = field(
        default=0.01,
        metadata={
            "help": "Floor of the probability of generating a predicted zero-signal prompt, so every prompt is "
            "revisited (GRESO: 0.01). In (0, 1]."
        },
    )
    selective_rollout_reward_min: float | None = field(
        default=None,
        metadata={
            "help": "Lower reward bound for classifying flat groups: a flat group is all-max when its value is in "
            "the upper half of [reward_min, reward_max], else all-min. None: the lowest reward seen so far."
        },
    )
    selective_rollout_reward_max: float | None = field(
        default=None,
        metadata={
            "help": "Upper reward bound (see selective_rollout_reward_min). None: the highest reward seen so far."
        },
    )

    # --- Multi-turn credit (grpo_hub/turns.py) ---
    turn_advantages: str | None = field(
        default=None,
        metadata={
            "help": "Per-turn advantages from per-turn rewards (reward functions decorated with "
            "grpo_hub.training.turns.per_turn_reward): each turn's tokens get A = turn advantage + outcome advantage "
            "(MT-GRPO). 'turn': a turn is compared with the same turn of its group; 'group': with every turn of its "
            "group. None: one advantage per completion (TRL)."
        },
    )

    # --- vLLM importance-sampling correction ---
    vllm_is_pooling: str | None = field(
        default=None,
        metadata={
            "help": "For the sequence_* vllm_importance_sampling_mode: 'sum' (TRL: product of token ratios) or "
            "'mean' (geometric mean of token ratios, length-independent). Bounds: vllm_importance_sampling_clip_min"
            "/_max. None: TRL's behaviour."
        },
    )
    vllm_is_preset: str | None = field(
        default=None,
        metadata={
            "help": f"'agilerl': AgileRL GRPO's correction, token-level weights clamp(exp(logp_trainer - logp_vllm), "
            f"max={AGILERL_TOKEN_CAP}) with no lower bound (sets vllm_importance_sampling_mode='token_truncate', "
            f"vllm_importance_sampling_clip_max={AGILERL_TOKEN_CAP}). None: TRL's mode and bounds as given."
        },
    )

    # --- Reference adapter (PEFT; see grpo_hub/reference.py) ---
    ref_adapter_sync_on: str = field(
        default="never",
        metadata={
            "help": "Refresh the frozen PEFT 'ref' adapter (the KL reference) from the trained adapter: 'never', "
            "'steps' (every ref_adapter_sync_steps optimizer steps) or 'epoch' (at each epoch end). Needs a PEFT "
            "model and beta > 0; for full fine-tuning use TRL's sync_ref_model."
        },
    )
    ref_adapter_sync_steps: int = field(
        default=64,
        metadata={"help": "With ref_adapter_sync_on='steps': refresh every this many optimizer steps."},
    )
    ref_adapter_mixup_alpha: float = field(
        default=1.0,
        metadata={
            "help": "Refresh rule ref <- alpha * trained + (1 - alpha) * ref, per adapter tensor; 1.0 = hard copy, "
            "in (0, 1) = EMA (of the adapter factors, not of the merged delta)."
        },
    )
    ref_adapter_keep: bool = field(
        default=False,
        metadata={
            "help": "Keep a dedicated frozen 'ref' adapter (a copy of the trained adapter at the start) also when the "
            "trainer wraps the model from peft_config; TRL makes one only for a PeftModel it is handed. Implied by "
            "ref_adapter_sync_on != 'never'."
        },
    )
    ref_adapter_save: bool = field(
        default=False,
        metadata={
            "help": "Keep the 'ref/' adapter folder in save_model() output. False: the saved (and pushed) folder holds "
            "only the trained adapter. Checkpoints always carry the reference (ref_adapter.safetensors)."
        },
    )

    def __post_init__(self):
        self._validate_values()
        self._validate_loss_type()
        self._validate_filtering()
        self._apply_presets()
        resolve_vllm_is(self)
        super().__post_init__()
        self._validate_clip()
        self._validate_loss_agg()
        self._validate_dynamic_sampling()
        self._validate_selective_rollout()
        self._validate_turn_advantages()
        self._validate_rewards()
        self._validate_advantages()
        self._validate_vllm_is()
        self._validate_reference_adapter()

    # --- validation and presets, one method per feature ---
    def _validate_values(self) -> None:
        """Type and finiteness of every field declared here, no NaN anywhere, no effect-less field (module doc)."""
        for name, annotation in inspect.get_annotations(GRPOHubConfig).items():
            check_type(name, getattr(self, name), annotation)
            check_finite(name, getattr(self, name))
        for name in FINITE_TRL_BOUNDS:
            check_finite(name, getattr(self, name), off="None (TRL's default)")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and math.isnan(value):
                field_error(f.name, "is NaN, which passes every range check.", "give a number.")
        defaults = {f.name: f.default for f in dataclasses.fields(GRPOHubConfig)}
        check_effect(self, EFFECT_NEEDS, defaults)

    def _validate_loss_type(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            field_error("loss_type", f"{self.loss_type!r} is not supported.", f"use one of {LOSS_TYPES}.")
        if self.importance_sampling_level is not None and self.importance_sampling_level not in losses.LEVELS:
            field_error(
                "importance_sampling_level",
                f"{self.importance_sampling_level!r} is not supported.",
                f"use one of {losses.LEVELS}.",
            )
        if self.loss_type == "gspo" and self.importance_sampling_level not in (None, "sequence"):
            field_error(
                "importance_sampling_level",
                f"loss_type='gspo' is sequence-level but importance_sampling_level={self.importance_sampling_level!r}.",
                "leave importance_sampling_level unset, or use loss_type='grpo' for a token/turn-level ratio.",
            )
        if self.importance_sampling_level == "turn" and self.loss_type not in (*OWN_PATH_LOSS_TYPES, "gspo"):
            field_error(
                "importance_sampling_level",
                f"'turn' is implemented for loss_type in {OWN_PATH_LOSS_TYPES}, not {self.loss_type!r}.",
                "use loss_type='grpo', 'dapo' or 'cispo', or importance_sampling_level='token'/'sequence'.",
            )

    def _validate_filtering(self) -> None:
        if self.zero_signal_eps < 0:
            field_error(
                "zero_signal_eps", f"must be >= 0, got {self.zero_signal_eps}.", "use 0.0 or a small spread."
            )
        if self.zero_signal_normalizer not in ZERO_SIGNAL_NORMALIZERS:
            field_error(
                "zero_signal_normalizer",
                f"{self.zero_signal_normalizer!r} is not supported.",
                f"use one of {ZERO_SIGNAL_NORMALIZERS}.",
            )
        for switch in ("filter_zero_signal", "dynamic_sampling", "selective_rollout"):
            if getattr(self, switch) and self.num_generations is not None and self.num_generations < 2:
                field_error(
                    switch,
                    f"needs groups of >= 2 completions, but num_generations={self.num_generations}.",
                    f"set num_generations >= 2 or {switch}=False.",
                )
        if self.zero_signal_pack:  # without filtering: EFFECT_NEEDS
            for reason in self._pack_blockers():
                field_error("zero_signal_pack", f"cannot apply: {reason}.", "leave zero_signal_pack unset.")
        row_mean = self.loss_type in ROW_MEAN_LOSSES and self.loss_agg_mode is None
        if self.filter_zero_signal and row_mean and (self.entropy_coef != 0.0 or self.use_adaptive_entropy):
            field_error(
                "entropy_coef",
                f"loss_type={self.loss_type!r} averages over rows, and filtering rescales that mean (pad rows must "
                "not dilute it), which would also rescale TRL's entropy bonus.",
                "use loss_type='dapo' (or a loss_agg_mode) with entropy_coef, or entropy_coef=0.0.",
            )

    def _validate_dynamic_sampling(self) -> None:
        """Dynamic sampling options (after TRL's __post_init__, which resolves generation_batch_size)."""
        if self.dynamic_sampling_on_cap not in DYNAMIC_SAMPLING_ON_CAP:
            field_error(
                "dynamic_sampling_on_cap",
                f"{self.dynamic_sampling_on_cap!r} is not supported.",
                f"use one of {DYNAMIC_SAMPLING_ON_CAP}.",
            )
        if self.dynamic_sampling_max_rounds < 0:
            field_error(
                "dynamic_sampling_max_rounds",
                f"must be >= 0, got {self.dynamic_sampling_max_rounds}.",
                "use e.g. 4.",
            )
        target = self.dynamic_sampling_target_groups
        if not self.dynamic_sampling:
            return
        if self.zero_signal_normalizer != "kept":
            field_error(
                "zero_signal_normalizer",
                "'all' (the unfiltered batch) is not defined across dynamic-sampling rounds.",
                "use zero_signal_normalizer='kept' (DAPO normalises over the trained batch).",
            )
        groups_per_batch = self.generation_batch_size // self.num_generations
        reachable = (1 + self.dynamic_sampling_max_rounds) * groups_per_batch
        if target is not None and not 1 <= target <= reachable:
            field_error(
                "dynamic_sampling_target_groups",
                f"must be in [1, {reachable}] ((1 + dynamic_sampling_max_rounds) x {groups_per_batch} groups per "
                f"generation batch), got {target}.",
                "lower the target or raise dynamic_sampling_max_rounds.",
            )
        self.filter_zero_signal = True

    def _validate_selective_rollout(self) -> None:
        if not self.selective_rollout:
            return  # its fields set without it are rejected by EFFECT_NEEDS
        if self.reward_norm is not None:
            field_error(
                "reward_norm",
                "rescales rewards per batch or over time, but selective_rollout tells all-max from all-min groups by "
                "their reward value.",
                "unset reward_norm (reward_clip is fine), or set selective_rollout=False.",
            )
        ranges = {
            "selective_rollout_target_zero_frac": (0.0, 1.0),
            "selective_rollout_explore_init": (selection.EXPLORE_LOW, selection.EXPLORE_HIGH),
            "selective_rollout_explore_step": (0.0, 1.0),
        }
        for name, (low, high) in ranges.items():
            if not low <= getattr(self, name) <= high:
                field_error(
                    name, f"must be in [{low}, {high}], got {getattr(self, name)}.", "use its default."
                )
        if not 0.0 < self.selective_rollout_min_keep_prob <= 1.0:
            field_error(
                "selective_rollout_min_keep_prob",
                f"must be in (0, 1], got {self.selective_rollout_min_keep_prob}; 0 would never revisit a prompt.",
                "use e.g. 0.01.",
            )
        low, high = self.selective_rollout_reward_min, self.selective_rollout_reward_max
        if low is not None and high is not None and not low < high:
            field_error(
                "selective_rollout_reward_min",
                f"must be < selective_rollout_reward_max, got {low} >= {high}.",
                "give the reward function's lowest and highest value.",
            )

    def _validate_turn_advantages(self) -> None:
        if self.turn_advantages is None:
            return
        if self.turn_advantages not in advantages.TURN_SCOPES:
            field_error(
                "turn_advantages",
                f"{self.turn_advantages!r} is not supported.",
                f"use one of {advantages.TURN_SCOPES} or None.",
            )
        clashing = {
            "reward_clip": self.reward_clip is not None,
            "reward_norm": self.reward_norm is not None,
            "adv_norm": self.adv_norm is not None,
            "whiten_advantages": self.whiten_advantages,
            "adv_clip_range": self.adv_clip_range is not None,
            "token_level_kl_coef": self.token_level_kl_coef > 0,
            "multi_objective_aggregation": self.multi_objective_aggregation != "sum_then_normalize",
        }
        for name, is_set in clashing.items():
            if is_set:
                field_error(
                    name,
                    "is not supported together with turn_advantages (per-turn rewards are used raw).",
                    f"reset {name} to its default or set turn_advantages=None.",
                )

    def _apply_presets(self) -> None:
        """Resolve the gspo/cispo presets and the None defaults onto TRL's own fields."""
        if self.loss_type == "gspo":
            self.loss_type = "grpo"
            self.importance_sampling_level = "sequence"
            if self.epsilon is None and self.epsilon_high is None:
                self.epsilon, self.epsilon_high = GSPO_EPSILON, GSPO_EPSILON_HIGH
        if self.epsilon is None:
            self.epsilon = TRL_EPSILON
        if self.importance_sampling_level is None:
            self.importance_sampling_level = "token"
        if self.loss_type == "cispo" and self.epsilon_high is None:
            self.epsilon_high = CISPO_EPSILON_HIGH

    def _validate_clip(self) -> None:
        if self.epsilon < 0:
            field_error(
                "epsilon", f"must be >= 0, got {self.epsilon}.", "use a small positive value such as 0.2."
            )
        if self.epsilon_high is not None and self.epsilon_high < 0:
            field_error(
                "epsilon_high", f"must be >= 0, got {self.epsilon_high}.", "use e.g. 0.28 (or 5.0 for cispo)."
            )
        if self.loss_type != "cispo" and self.epsilon >= 1:
            field_error(
                "epsilon",
                f"the lower clip bound 1 - epsilon = {1 - self.epsilon} is not positive, so the clip range is inverted.",
                "use epsilon < 1.",
            )
        if self.loss_type == "cispo" and self.epsilon_high <= 1:
            field_error(
                "epsilon_high",
                f"with loss_type='cispo' it is the absolute ratio cap, and {self.epsilon_high} <= 1 down-weights "
                "every on-policy token.",
                "use epsilon_high > 1 (recommended 5.0) or leave it unset.",
            )
        if self.dual_clip_c is None:
            return
        if self.loss_type not in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
            field_error(
                "dual_clip_c",
                f"applies to clipped surrogates, not loss_type={self.loss_type!r}.",
                "unset it.",
            )
        upper = 1 + (self.epsilon_high if self.epsilon_high is not None else self.epsilon)
        if self.dual_clip_c <= upper:
            field_error(
                "dual_clip_c",
                f"must be > 1 + epsilon_high = {upper}, got {self.dual_clip_c}.",
                "use e.g. dual_clip_c=3.0.",
            )
        if self.delta is not None and self.delta != self.dual_clip_c:
            field_error(
                "dual_clip_c",
                f"and TRL's delta={self.delta} set the same cap differently.",
                "set only one of dual_clip_c and delta.",
            )
        self.delta = self.dual_clip_c

    def _pack_blockers(self) -> list[str]:
        """Why moving rows between micro-steps would change the gradient (empty: packing is exact)."""
        reasons = []
        if self.loss_type == "bnpo" and self.loss_agg_mode is None:
            reasons.append("loss_type='bnpo' is a token mean over each micro-batch")
        if self.top_entropy_quantile < 1.0:
            reasons.append("top_entropy_quantile < 1 takes its entropy quantile over each micro-batch")
        return reasons

    @property
    def packs_rows(self) -> bool:
        """Whether GRPOHubTrainer packs the kept rows of a filtered batch into fewer micro-steps."""
        return self.filter_zero_signal and self.zero_signal_pack is not False and not self._pack_blockers()

    @property
    def uses_own_loss(self) -> bool:
        """Whether GRPOHubTrainer computes the loss itself instead of TRL's `_compute_loss`."""
        return self.loss_agg_mode is not None or self.importance_sampling_level == "turn"

    def _validate_loss_agg(self) -> None:
        if self.loss_agg_mode is not None and self.loss_agg_mode not in losses.AGG_MODES:
            field_error(
                "loss_agg_mode",
                f"{self.loss_agg_mode!r} is not supported.",
                f"use one of {losses.AGG_MODES}.",
            )
        if self.loss_agg_mode is not None and self.loss_type not in OWN_PATH_LOSS_TYPES:
            field_error(
                "loss_agg_mode",
                f"loss_type={self.loss_type!r} fixes its own normaliser.",
                "use loss_type='grpo' (or 'gspo', 'dapo', 'cispo') with loss_agg_mode, or unset loss_agg_mode.",
            )
        if not self.uses_own_loss:
            return
        unsupported = {
            "off_policy_mask_threshold": self.off_policy_mask_threshold is not None,
            "top_entropy_quantile": self.top_entropy_quantile < 1.0,
            "entropy_coef": self.entropy_coef != 0.0 or self.use_adaptive_entropy,
        }
        for name, is_set in unsupported.items():
            if is_set:
                field_error(
                    name,
                    "is not supported together with loss_agg_mode or importance_sampling_level='turn'.",
                    f"reset {name} to its default, or unset loss_agg_mode / use a token or sequence level.",
                )

    def _validate_rewards(self) -> None:
        if self.reward_clip is not None and self.reward_clip <= 0:
            field_error(
                "reward_clip", f"must be > 0, got {self.reward_clip}.", "use a positive bound or None."
            )
        if self.reward_norm is not None and self.reward_norm not in advantages.REWARD_NORMS:
            field_error(
                "reward_norm",
                f"{self.reward_norm!r} is not supported.",
                f"use one of {advantages.REWARD_NORMS} or None.",
            )
        if self.reward_shift and self.reward_scale:
            field_error(
                "reward_shift", "and reward_scale together leave nothing to normalise.", "set only one."
            )
        if self.token_level_kl_coef < 0:
            field_error(
                "token_level_kl_coef",
                f"must be >= 0, got {self.token_level_kl_coef}.",
                "use 0.0 or e.g. 0.001.",
            )

    @property
    def recomputes_advantages(self) -> bool:
        """Whether GRPOHubTrainer recomputes the advantages instead of keeping TRL's."""
        return (
            self.adv_norm == "none"
            or self.whiten_advantages
            or self.adv_clip_range is not None
            or self.token_level_kl_coef > 0
        )

    def _validate_advantages(self) -> None:
        if self.adv_norm is not None and self.adv_norm not in advantages.NORMS:
            field_error(
                "adv_norm", f"{self.adv_norm!r} is not supported.", f"use one of {advantages.NORMS} or None."
            )
        if self.adv_norm == "mean_std" and self.scale_rewards == "none":
            field_error(
                "adv_norm",
                "'mean_std' needs a std scope but scale_rewards='none'.",
                "set scale_rewards='group'.",
            )
        if self.adv_norm == "mean_only":
            if self.scale_rewards == "batch":
                field_error(
                    "adv_norm", "'mean_only' contradicts scale_rewards='batch'.", "unset one of them."
                )
            self.scale_rewards = "none"
        if self.adv_clip_range is not None and self.adv_clip_range <= 0:
            field_error(
                "adv_clip_range", f"must be > 0, got {self.adv_clip_range}.", "use a positive bound or None."
            )
        if self.recomputes_advantages and self.multi_objective_aggregation != "sum_then_normalize":
            field_error(
                "multi_objective_aggregation",
                "'normalize_then_sum' builds its own advantages, which adv_norm='none', whiten_advantages, "
                "adv_clip_range and token_level_kl_coef cannot edit.",
                "use multi_objective_aggregation='sum_then_normalize' or turn those options off.",
            )

    def _validate_vllm_is(self) -> None:
        check_sampler_matches_trainer(self)
        if self.vllm_is_pooling is None:
            return
        if self.vllm_is_pooling not in importance.POOLINGS:
            field_error(
                "vllm_is_pooling",
                f"{self.vllm_is_pooling!r} is not supported.",
                f"use one of {importance.POOLINGS}.",
            )
        if not self.vllm_importance_sampling_mode.startswith("sequence_"):
            field_error(
                "vllm_is_pooling",
                f"pools token ratios into a sequence ratio, but vllm_importance_sampling_mode="
                f"{self.vllm_importance_sampling_mode!r} is token-level.",
                "use vllm_importance_sampling_mode='sequence_mask' or 'sequence_truncate'.",
            )

    def _validate_reference_adapter(self) -> None:
        validate_reference_settings(
            self.ref_adapter_sync_on,
            self.ref_adapter_sync_steps,
            self.ref_adapter_mixup_alpha,
            self.beta,
            self.sync_ref_model,
            self.ref_adapter_keep,
        )

    @property
    def uses_reference_adapter(self) -> bool:
        return self.ref_adapter_keep or self.ref_adapter_sync_on != "never"
