"""GRPOHubConfig: `trl.GRPOConfig` plus the grpo_hub features, each off by default.

With every new field at its default the config is exactly a `trl.GRPOConfig`. Fields are grouped by feature and
documented once, here. `__post_init__` checks every field's type and finiteness (None turns a bound off, never
`inf`) and NaN in any float field, then builds in two phases (grpo_hub.config.resolve_and_validate): resolve
presets and implied switches, then validate the resolved config. A field set explicitly -- its value differs from its
default -- whose switch is off (`EFFECT_NEEDS`) is an error, since it would have no effect; a value equal to the
default cannot be told apart from an unset one and is accepted. Every error is a ValueError naming the field (both
fields for a conflict) and the fix.
"""

import dataclasses
import inspect
import math
from dataclasses import dataclass, field

from trl import GRPOConfig

from grpo_hub.algos import loss_types
from grpo_hub.algos.shared_prompts import exchange_block
from grpo_hub.config import features, resolve_and_validate, value_ranges
from grpo_hub.config.trl_version import check_trl_version
from grpo_hub.config.validation import check_effect, check_finite, check_type
from grpo_hub.config.vllm_checks import AGILERL_TOKEN_CAP
from grpo_hub.errors import field_error

check_trl_version()

EFFECT_NEEDS = features.effect_needs()  # field -> (what it needs, predicate on the resolved config)
# TRL bounds that grpo_hub's checks compare against: finite, or None for TRL's default / off.
FINITE_TRL_BOUNDS = ("epsilon_high", "delta")


@dataclass
class GRPOHubConfig(GRPOConfig):
    """`trl.GRPOConfig` with grpo_hub's extra GRPO-family options (each field: docs/config-reference.md)."""

    # --- Parent fields whose defaults are resolved in __post_init__ (None = "not set by the user") ---
    loss_type: str = field(
        default="dapo",
        metadata={
            "help": f"TRL's loss types {', '.join(map(repr, loss_types.TRL_NAMES))} (default 'dapo') plus the "
            "preset 'gspo' = 'grpo' with importance_sampling_level='sequence' and, unless epsilon/epsilon_high are "
            f"set, the GSPO paper's clip range (epsilon, epsilon_high) = {loss_types.REGISTRY['gspo'].clip_range}. "
            "'cispo' without epsilon_high sets the recommended cap "
            f"epsilon_high={loss_types.REGISTRY['cispo'].default_epsilon_high}. Each one's denominator, surrogate "
            "and presets: grpo_hub/algos/loss_types.py."
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
            f"denominator of loss_type {'/'.join(map(repr, loss_types.OWN_PATH_NAMES))} (the own loss path). None: "
            "the loss_type's own denominator."
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
            "'batch'); 'mean_only' (r - mean, sets scale_rewards='none'); 'no_baseline' (A = r: the raw reward; "
            "'none' is its deprecated name). None: TRL's scale_rewards decides."
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
            "help": "Loss denominator under filtering. 'kept' (DAPO): tokens/rows that are trained, so the loss is a "
            "mean over the kept rows. 'all': the denominator of the unfiltered batch, which keeps TRL's gradient "
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

    # --- Padding-free forwards (grpo_hub/algos/padding_free.py, grpo_hub/training/padding_free.py) ---
    padding_free: bool = field(
        default=False,
        metadata={
            "help": "Run every policy and reference forward of the trainer over the rows' real tokens only: each "
            "row's prompt and completion tokens are laid end to end in bins with their own position ids (no pad "
            "token computed but the bins' short tails), and the log-probs and entropies come back in TRL's padded "
            "layout, so every loss, filter and metric is unchanged up to fp32 rounding. Only what is proven exact is "
            "accepted (checked when the trainer is built): attention-only text decoders of transformers' own code "
            "(Llama, Mistral, Qwen2/3 and their MoE, Gemma 1-3, Phi-3, OLMo2, Granite, SmolLM3; hybrids with "
            "convolution or Mamba layers are refused), sdpa or eager attention, LoRA/LoHa/LoKr/IA3 adapters (prompt "
            "learning and prefix tuning are refused). False: TRL's padded forwards."
        },
    )
    shared_prompts: bool = field(
        default=False,
        metadata={
            "help": "Padding-free's next level (needs padding_free=True): within each micro-batch, the rows whose "
            "prompt tokens are equal (a group's completions, ragged groups too) compute the prompt once; each "
            "completion attends to the prompt and its own earlier tokens only (an attention mask handed to the "
            "model), at its row's own positions, so log-probs, entropies, gradients and metrics are padding-free's "
            "up to fp32 rounding. The saving grows with the prompt's share of a row and with the rows of a group in "
            "one micro-batch (TRL shuffles a generation batch before splitting it into micro-batches). Models whose "
            "mask it cannot hand over are refused by name when the trainer is built. False: every row computes its "
            "own prompt."
        },
    )
    shared_prompts_whole_groups: bool | None = field(
        default=None,
        metadata={
            "help": "With shared_prompts and several micro-batches per optimizer step: put each prompt's rows "
            "together in as few micro-batches as their sizes allow, instead of where TRL's shuffle put them (about "
            "G / k rows of a group in each of k micro-batches, so each micro-batch computed most prompts again). "
            "Rows move only between micro-batches that always train in the same optimizer step (blocks of "
            "gcd(steps_per_generation, gradient_accumulation_steps)), so the update is the same up to fp32 rounding "
            "wherever the loss does not depend on which micro-step a row trains in; the per-micro-batch means TRL "
            "logs (clip ratios, entropy) are taken over other rows. None: on whenever shared_prompts is on, the "
            "block holds two or more micro-batches and the loss allows it (not bnpo, not top_entropy_quantile < 1, "
            "no entropy bonus). True: required (error when it cannot apply). False: TRL's micro-batches."
        },
    )

    # --- Wall-clock budget (grpo_hub/algos/time_budget.py, grpo_hub/training/time_budget.py) ---
    time_budget_seconds: float | None = field(
        default=None,
        metadata={
            "help": "Train for this many wall seconds (counted from the start of train(); the seconds before a "
            "resumed checkpoint count too). From step time_budget_calibration_steps on, after every optimizer step, "
            "the run's length and its learning-rate schedule (lr_scheduler_type with its warmup, rebuilt for that "
            "length) are set to the steps that fit in the budget at the pace measured so far (mean seconds per step "
            "after the first), so the schedule ends at the budget. At most the steps max_steps or num_train_epochs "
            "give: set those as the upper bound. All ranks follow the slowest rank's clock. Logged as "
            "time_budget/planned_steps. None: off, the length is max_steps or num_train_epochs."
        },
    )
    time_budget_calibration_steps: int = field(
        default=4,
        metadata={
            "help": "With time_budget_seconds: optimizer steps run on the schedule of the upper bound before the "
            "first plan (>= 2: the first step, which also pays the warm-up, is left out of the pace)."
        },
    )

    # --- Dynamic sampling (DAPO; grpo_hub/training/dynamic_sampling.py) ---
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
            "dynamic_sampling/cap_hit), or 'error' (raise, as verl does)."
        },
    )

    # --- Selective rollout (GRESO; grpo_hub/algos/selection.py, grpo_hub/training/selective_rollout.py) ---
    selective_rollout: bool = field(
        default=False,
        metadata={
            "help": "GRESO pre-rollout filtering: before a generation batch is generated, skip each prompt whose last "
            "z scorings were all zero-signal of one kind (all-max or all-min reward) with probability "
            "1 - max(p_kind^z, selective_rollout_min_keep_prob); selective_rollout_mode says what takes its place. "
            "p_kind adapts toward selective_rollout_target_zero_frac. See docs/selective-rollout.md."
        },
    )
    selective_rollout_mode: str = field(
        default="replace",
        metadata={
            "help": "What takes a skipped prompt's place: 'replace' (the next prompts of the epoch, so the batch keeps "
            "its size and generates as many tokens as TRL's; an epoch takes fewer steps) or 'shrink' (nothing: the "
            "step generates only the kept groups, rounded up so the ranks and micro-steps split them evenly, GRESO's "
            "rollout saving; an epoch keeps its step count, and the loss averages over the rows generated)."
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
        metadata={
            "help": "Change of an exploration probability per generation batch (its refill rounds pooled), from "
            "the second epoch on (GRESO: 0.01 per training step, from the second epoch)."
        },
    )
    selective_rollout_min_keep_prob: float = field(
        default=0.01,
        metadata={
            "help": "Floor of the probability of generating a predicted zero-signal prompt, so every prompt is "
            "revisited (GRESO: 0.01). In (0, 1]."
        },
    )
    selective_rollout_revisit_after: int | None = field(
        default=1,
        metadata={
            "help": "Bounded revisit: a prompt skipped revisit_after * z times since it was last generated (z: its "
            "zero-signal streak) is generated at its next visit, whatever the skip probability, so a prompt that "
            "became learnable is seen again within that many epochs (GRESO's linear-backoff rule bounds the wait "
            "the same way). None: no bound (GRESO's probabilistic rule alone: at the 0.05 exploration floor a "
            "skipped prompt waits 20-100 epochs, and hard prompts leave training; docs/selective-rollout.md)."
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

    # --- Per-prompt rollout budgets (Knapsack RL; grpo_hub/algos/rollout_budget.py, training/rollout_budget.py) ---
    rollout_budget: str = field(
        default="uniform",
        metadata={
            "help": "How many completions each prompt of a generation batch gets. 'uniform': num_generations each "
            "(TRL). 'knapsack': Knapsack RL (arXiv:2509.25849): the batch's completions (prompts x num_generations, "
            "so a step generates as many rows as TRL's) are shared out, each prompt between rollout_budget_min and "
            "rollout_budget_max, to maximise the expected number of groups with both a solved and an unsolved "
            "completion weighted by p(1-p)^2, where p is the prompt's success rate estimated from its earlier "
            "groups. 'signal': the same without the weight (the expected number of groups with both outcomes). "
            "Each group's advantages run over its own completions. See docs/rollout-budget.md."
        },
    )
    rollout_budget_min: int = field(
        default=2,
        metadata={"help": "Fewest completions a prompt gets (>= 2: a group of one has no baseline)."},
    )
    rollout_budget_max: int | None = field(
        default=None,
        metadata={
            "help": "Most completions a prompt gets. None: 4 x num_generations. Capped by the batch's completions."
        },
    )
    rollout_budget_column: str | None = field(
        default=None,
        metadata={
            "help": "Dataset column that groups prompts (e.g. a difficulty level): a prompt's estimate starts from "
            "the success rate of its value's completions so far (else the run's), and each value gets a metric, "
            "the mean completions per prompt (rollout_budget/completions/<value>). None: the run's rate only."
        },
    )
    rollout_budget_success_threshold: float = field(
        default=1.0,
        metadata={
            "help": "A completion counts as solved, in the prompts' success estimates, when its reward (the weighted "
            "sum of the reward functions, as TRL's advantages see it) is at least this: a fixed threshold, so the "
            "history counts alike from the first batch on. 1.0: a right answer under a 0/1 correctness reward, also "
            "with partial credit below 1 beside it (chain-steps.yaml: correctness + 0.5 x steps). Set it to a value "
            "every right answer reaches and no wrong one does; rollout_budget/frac_solved logs the share counted "
            "solved."
        },
    )

    # --- Hint-guided rollouts (QuestA / POPE / R3; grpo_hub/algos/hints.py, training/hints.py) ---
    hint_column: str | None = field(
        default=None,
        metadata={
            "help": "Dataset column holding each prompt's reference solution: a string split into steps by "
            "hint_separator, or a list of steps. On: a prompt none of whose completions was right starts its next "
            "rollouts from the first steps of its solution, written as the beginning of the model's own answer (a "
            "conversational prompt: the start of the assistant turn), which the model continues (QuestA "
            "arXiv:2507.13266, POPE arXiv:2601.18779). The hint grows a step while no completion is right, shrinks a "
            "step once hint_shorten_at of them are (reverse curriculum, R3 arXiv:2402.05808), never holds the last "
            "step, and is gone by hint_end of the run. The hint is context: no loss, KL or entropy on it; a hinted "
            "prompt's group is its own group; reward functions get the hint and completion as one answer and the "
            "row's `hint`. Evaluation never sees hints. None: off. See docs/hints.md."
        },
    )
    hint_separator: str = field(
        default="\n",
        metadata={
            "help": "What splits a solution string into steps (the chain task: ','; GSM8K: a new line)."
        },
    )
    hint_group_column: str | None = field(
        default=None,
        metadata={
            "help": "Dataset column whose value groups prompts that share one hint length (e.g. a difficulty "
            "level: prompts that come back rarely learn from their level's outcomes); each value also gets its "
            "metrics (hints/length/<value>, hints/right/<value>). None: each prompt its own length."
        },
    )
    hint_success_threshold: float = field(
        default=1.0,
        metadata={
            "help": "A completion is right when its reward (the reward functions' weighted sum) is at least this "
            "(the rule rollout_budget_success_threshold counts solved completions by)."
        },
    )
    hint_shorten_at: float = field(
        default=0.5,
        metadata={"help": "Share of a state's completions right at which its hint shrinks a step (0-1]."},
    )
    hint_window: int = field(
        default=32,
        metadata={
            "help": "Completions of a state (a prompt, or a hint_group_column value) scored at one hint length "
            "before its length is decided: longer when none of them was right, shorter when hint_shorten_at of them "
            "were."
        },
    )
    hint_end: float | None = field(
        default=None,
        metadata={
            "help": "Share of the run's steps (0-1] by which every hint is gone: the longest hint allowed falls "
            "linearly, a step at a time, to none at this point. None: no run-level fall, each state's hint shrinks "
            "as its hinted completions succeed (on the main job, 1 seed: held-out 0.41 with None, 0.39 with 1.0)."
        },
    )

    # --- Multi-turn credit (grpo_hub/training/turns.py) ---
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

    # --- vLLM weight sync of a LoRA adapter (grpo_hub/generation/adapter_sync.py) ---
    vllm_adapter_sync: bool = field(
        default=False,
        metadata={
            "help": "Colocate mode with a PEFT LoRA model: the engine loads the base weights once, with LoRA enabled "
            "(rank bound from the adapter), and each sync hands it the trained adapter's A/B tensors in memory; "
            "generation runs with that adapter, nothing is merged and no base weight moves. In server mode it means "
            "vllm_server_sync='adapter'. Refused: sleep mode, no PEFT model, modules_to_save, DoRA, trained biases, "
            "adapters on the embeddings or the LM head (docs/vllm.md). False: TRL's sync (merge, push every base "
            "weight, unmerge)."
        },
    )

    # --- vLLM server mode over HTTP, no NCCL (grpo_hub/generation/server.py; docs/async.md) ---
    vllm_server_sync: str = field(
        default="auto",
        metadata={
            "help": "How the trainer's weights reach a vLLM OpenAI server (vllm_mode='server') before each "
            "generation after an optimizer step: 'adapter' (the trained LoRA adapter only, served under a fresh name "
            "through /v1/load_lora_adapter), 'merged' (the merged LoRA or full weights, reloaded in place by "
            "grpo_hub's worker extension through /collective_rpc), 'nccl' (TRL's own sync over an NCCL group, "
            "CUDA on both sides), or 'auto' (TRL's sync for a server without grpo_hub's worker extension or runtime "
            "LoRA loading when CUDA is there; else merged without PEFT or on a CPU server, the adapter on a GPU "
            "server when the base weights reach 1 GiB; docs/vllm.md)."
        },
    )
    vllm_server_sync_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder each server sync writes the adapter or weights to, owner-only; the server reads them at "
            "the same path (a shared filesystem for a server on another node). A grpo_hub server loads weights only "
            "from its own sync folder, fixed when it starts (`grpo-hub vllm-serve` prints it): set that folder here. "
            "None: the folder of the server this process started (the recipe's --vllm_server_start), or a temporary "
            "folder on this machine for a server without one; a folder another server names is refused."
        },
    )
    max_staleness: int = field(
        default=0,
        metadata={
            "help": "Asynchronous rollouts in server mode: the server generates the next max_staleness generation "
            "batches while the trainer trains the current one, so every trained row comes from a policy at most "
            "max_staleness optimizer steps old; vLLM's importance-sampling correction (its log-probs are the "
            "behaviour policy's) makes the update off-policy-correct. 0: synchronous, TRL's loop (docs/async.md)."
        },
    )

    # --- Reference adapter (PEFT; see grpo_hub/training/reference.py) ---
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
        """Two phases (grpo_hub.config.resolve_and_validate): resolve presets and implied switches (what depends on
        TRL's own resolution, after it), then validate the resolved config, which validation never changes. Type,
        finiteness and NaN checks run first, on the values given."""
        self.implied_by = {}  # switch -> the switch that turned it on while resolving
        self._check_values()
        explicit = {name for name in EFFECT_NEEDS if getattr(self, name) != DEFAULTS[name]}
        resolve_and_validate.resolve(self)
        super().__post_init__()
        resolve_and_validate.resolve_after_trl(self)
        check_effect(self, {name: EFFECT_NEEDS[name] for name in explicit}, DEFAULTS)
        resolve_and_validate.validate(self)

    def _check_values(self) -> None:
        """Type and finiteness of every field declared here, no NaN in any float field or list (TRL's included), the
        ranges and forms of TRL's and transformers' settings (`value_ranges`), and whole groups in every generation
        batch."""
        for name, annotation in inspect.get_annotations(GRPOHubConfig).items():
            check_type(name, getattr(self, name), annotation)
            check_finite(name, getattr(self, name))
        for name in FINITE_TRL_BOUNDS:
            check_finite(name, getattr(self, name), off="None (TRL's default)")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if any(
                isinstance(v, float) and math.isnan(v)
                for v in (value if isinstance(value, list) else [value])
            ):
                field_error(f.name, "is NaN, which passes every range check.", "give a number.")
        value_ranges.check_non_empty(self)
        value_ranges.check_ranges(self)  # TRL's and transformers' numbers, named as set
        value_ranges.check_pad_to_multiple_of(self.pad_to_multiple_of)
        value_ranges.check_dict_settings(self)
        value_ranges.check_groups_fit(self, value_ranges.launched_processes())

    # --- what the resolved config changes in the trainer (asked of the feature rows) ---
    @property
    def packs_rows(self) -> bool:
        """Whether GRPOHubTrainer packs the kept rows of a filtered batch into fewer micro-steps."""
        return features.is_on("packing", self)

    @property
    def whole_group_block(self) -> int:
        """How many buffered micro-batches GRPOHubTrainer re-splits together so each prompt's rows sit together (1: it
        keeps TRL's micro-batches)."""
        if not features.is_on("whole_groups", self):
            return 1
        return exchange_block(self.steps_per_generation, self.gradient_accumulation_steps)

    @property
    def uses_own_loss(self) -> bool:
        """Whether GRPOHubTrainer computes the loss itself instead of TRL's `_compute_loss`."""
        return features.any_on(features.OWN_LOSS, self)

    @property
    def recomputes_advantages(self) -> bool:
        """Whether GRPOHubTrainer recomputes the advantages instead of keeping TRL's."""
        return features.any_on(features.EDITS_ADVANTAGES, self)

    @property
    def uses_reference_adapter(self) -> bool:
        return self.ref_adapter_keep or features.is_on("ref_adapter_refresh", self)

    @property
    def loss_denominator(self) -> str:
        """What one micro-batch's loss is divided by (`loss_types.DENOMINATORS`)."""
        return loss_types.denominator_kind(self.loss_type, self.loss_agg_mode)


DEFAULTS = {f.name: f.default for f in dataclasses.fields(GRPOHubConfig)}
