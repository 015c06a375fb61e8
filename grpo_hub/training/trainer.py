"""GRPOHubTrainer: `trl.GRPOTrainer` with grpo_hub's features wired through TRL's seams.

- `_calculate_rewards`: reward clip / normalisation per reward function (rewards are already gathered).
- `_generate_and_score_completions`: call TRL, then edit its output dict: recompute advantages (adv_norm,
  whitening, clipping, KL in the reward), geometric-mean vLLM IS weights, zero-signal row dropping, and the
  share of zero-signal groups at the top / bottom of the reward range (`zero_signal/frac_groups_all_*`). Before
  calling TRL, selective rollout (GRESO) may replace prompts predicted zero-signal; after the rewards, it
  records their outcome.
- `_compute_loss`: TRL's loss unless loss_agg_mode or turn-level ratios need the own path.
- `_prepare_inputs` (TRL's buffered generation batch) and `training_step`: under filtering, the kept rows are
  packed into fewer micro-steps and the empty ones run no forward/backward (`algos.filtering.packing_plan`).
- `get_batch_samples` and `_init_training_state` (transformers): with dynamic sampling or selective rollout, the
  batch stream counts every pull, and a resume starts where the stream was saved (`training.batch_stream`).
Every formula lives in `grpo_hub.algos` (advantages, losses, importance, filtering); the helpers of this wing get
narrow inputs (callables, a metrics dict) from here. Nothing here copies TRL code.
"""

import copy

import torch
from accelerate.utils import gather_object, is_peft_model
from trl import GRPOTrainer
from trl.trainer.utils import use_adapter

from grpo_hub.algos import advantages as adv_fns
from grpo_hub.algos import importance, losses
from grpo_hub.algos.filtering import (
    agreed_row_count,
    concat_micro_batches,
    keep_rows,
    packed_rows,
    packing_plan,
)
from grpo_hub.training.batch_stream import BatchStreamCallback, GenerationBatchStream, load_stream_state
from grpo_hub.training.compat import check_trl_seams
from grpo_hub.training.config import ROW_MEAN_LOSSES, GRPOHubConfig
from grpo_hub.training.dynamic_sampling import DynamicSampler
from grpo_hub.training.finite_guard import FiniteGradientsCallback
from grpo_hub.training.input_checks import (
    check_advantages_finite,
    check_batch_prompts,
    check_dataset_prompts,
    check_rewards_finite,
    checked_reward_funcs,
)
from grpo_hub.training.model_card import write_card_files
from grpo_hub.training.reference import attach_reference_adapter, strip_reference_adapter
from grpo_hub.training.run_record import run_record
from grpo_hub.training.selective_rollout import SelectiveRollout, SelectiveRolloutCallback, signature_columns
from grpo_hub.training.turns import TurnCredit, turn_ids_from_tool_mask
from grpo_hub.training.vllm_runtime import is_settings, log_is_diagnostics, prepare_vllm_generation

check_trl_seams(GRPOTrainer)


class GRPOHubTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` that also honours every `GRPOHubConfig` field; with defaults it is TRL's trainer."""

    def __init__(self, model, reward_funcs=None, args: GRPOHubConfig | None = None, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = GRPOHubConfig(f"{name.split('/')[-1]}-GRPO")
        if not isinstance(args, GRPOHubConfig):
            raise ValueError(
                f"`args` must be a GRPOHubConfig, got {type(args).__name__}; build a GRPOHubConfig."
            )
        super().__init__(model, reward_funcs, args=args, **kwargs)
        prepare_vllm_generation(
            args, getattr(self, "vllm_generation", None), self.accelerator.is_main_process
        )
        self._check_data_dependent_options(kwargs)
        self.add_callback(FiniteGradientsCallback())  # weights never become NaN/inf
        self._reference_callback = attach_reference_adapter(self)  # frozen 'ref' adapter + refresh
        self._reward_moments = [adv_fns.RunningMoments() for _ in self.reward_funcs]
        self._scored_rewards = None  # rewards_per_func of the batch being scored (all ranks)
        self._reward_range = (float("inf"), float("-inf"))  # lowest / highest reward seen (zero-signal kinds)
        self._batch_stream = None  # the epoch read in generation batches, for refills and replacements
        self._resumed_from = None  # checkpoint whose stream position is being restored
        if args.dynamic_sampling or args.selective_rollout:
            self._batch_stream = GenerationBatchStream(args.steps_per_generation * self.num_iterations)
            self.add_callback(BatchStreamCallback(self._batch_stream))
        self._dynamic_sampler = self._make_dynamic_sampler() if args.dynamic_sampling else None
        self._selector = self._make_selector() if args.selective_rollout else None
        self._packing_plan = None  # per position of the generation cycle: rows to train, or None (skipped)
        self._window_position = 0  # micro-steps of the current optimizer step already run
        self._ready_micro_batch = None  # packed micro-batch handed to transformers' training_step
        self._turn_credit = None
        if args.turn_advantages:
            self._turn_credit = TurnCredit(
                self.reward_funcs,
                self.reward_func_names,
                self.reward_weights,
                args.turn_advantages,
                self._gather,
            )

    def _make_dynamic_sampler(self) -> DynamicSampler:
        args = self.args
        return DynamicSampler(
            score_round=self._score_round,
            drop_rows=self._drop_rows,
            gather=self._gather,
            rank=self.accelerator.process_index,
            pad_token_id=self._tokenizer.pad_token_id,
            group_size=self.num_generations,
            target=args.dynamic_sampling_target_groups or args.generation_batch_size // self.num_generations,
            max_rounds=args.dynamic_sampling_max_rounds,
            on_cap=args.dynamic_sampling_on_cap,
            stream=self._batch_stream,
            metrics=self._metrics["train"],
        )

    def _make_selector(self) -> SelectiveRollout:
        args = self.args
        selector = SelectiveRollout(
            stream=self._batch_stream,
            gather_objects=gather_object,
            gather=self._gather,
            rank=self.accelerator.process_index,
            group_size=self.num_generations,
            id_column=args.selective_rollout_id_column,
            explore_init=args.selective_rollout_explore_init,
            target=args.selective_rollout_target_zero_frac,
            step=args.selective_rollout_explore_step,
            min_keep=args.selective_rollout_min_keep_prob,
            eps=args.zero_signal_eps,
            reward_min=args.selective_rollout_reward_min,
            reward_max=args.selective_rollout_reward_max,
            seed=args.seed,
            metrics=self._metrics["train"],
        )
        self._selector_callback = SelectiveRolloutCallback(selector)
        self.add_callback(self._selector_callback)
        return selector

    def _set_signature_columns_if_needed(self):
        """TRL's kept columns (`remove_unused_columns=True`), plus the selective-rollout id column."""
        super()._set_signature_columns_if_needed()
        self._signature_columns = signature_columns(
            self._signature_columns, self.args.selective_rollout_id_column
        )

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` of every rank, concatenated along dim 0 (moved to this rank's device first)."""
        return self.accelerator.gather(tensor.to(self.accelerator.device))

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """TRL's train; a checkpoint folder given here also restores the frozen "ref" adapter and the selective-rollout
        state saved in it."""
        if self._reference_callback is not None and isinstance(resume_from_checkpoint, str):
            self._reference_callback.resume_from = resume_from_checkpoint
        if self._selector is not None and isinstance(resume_from_checkpoint, str):
            self._selector_callback.resume_from = resume_from_checkpoint
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """TRL's save, without PEFT's frozen `ref/` adapter folder unless `ref_adapter_save` (grpo_hub.training.reference);
        a LoRA save also gets the model card, reward curve and run record (grpo_hub.training.model_card)."""
        super().save_model(output_dir, _internal_call)
        if not self.args.ref_adapter_save and self.args.should_save:
            strip_reference_adapter(output_dir or self.args.output_dir)
        if self.args.should_save and is_peft_model(self.model):  # the card and run record a push reads
            base = getattr(self.model.config, "_name_or_path", None)
            record = run_record(self.args, self.state.log_history, self.state.global_step, base)
            write_card_files(output_dir or self.args.output_dir, record)

    def _check_data_dependent_options(self, kwargs) -> None:
        args = self.args
        multi_turn = any(kwargs.get(k) is not None for k in ("tools", "environment_factory", "rollout_func"))
        if args.importance_sampling_level == "turn" and not multi_turn:
            raise ValueError(
                "`importance_sampling_level`: 'turn' needs multi-turn rollouts. Fix: pass `tools`, "
                "`environment_factory` or `rollout_func` to the trainer, or use 'token'/'sequence'."
            )
        if self._is_vlm and (args.filter_zero_signal or args.uses_own_loss):
            raise ValueError(
                "`filter_zero_signal`: dropping rows, loss_agg_mode and turn-level ratios are not supported for "
                "vision-language models. Fix: set filter_zero_signal=False and loss_agg_mode=None."
            )
        eval_sets = self.eval_dataset if isinstance(self.eval_dataset, dict) else {"": self.eval_dataset}
        check_dataset_prompts(
            {"train_dataset": self.train_dataset}
            | {f"eval_dataset[{k!r}]" if k else "eval_dataset": v for k, v in eval_sets.items()}
        )
        has_reference = self.beta != 0.0 or is_peft_model(self.model)
        if args.token_level_kl_coef > 0 and not has_reference:
            raise ValueError(
                "`token_level_kl_coef`: needs reference log-probs, which TRL only has with beta != 0 or a PEFT "
                "model. Fix: set beta > 0 or train a LoRA adapter (peft_config=...)."
            )

    # --- seam 1: rewards ---
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        funcs = self.reward_funcs
        self.reward_funcs = checked_reward_funcs(funcs, self.reward_func_names)
        try:  # each reward function's output is checked before TRL reads it (input_checks)
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        finally:
            self.reward_funcs = funcs
        check_rewards_finite(rewards_per_func, self.reward_func_names)
        args = self.args
        if args.reward_clip is not None or args.reward_norm is not None:
            training = self.model.training
            raw = self._weighted_rewards(rewards_per_func)
            self._metrics["train" if training else "eval"]["reward_raw"].append(torch.nanmean(raw).item())
            columns = []
            for i, moments in enumerate(self._reward_moments):
                state = moments if training else copy.deepcopy(moments)  # eval never updates running stats
                columns.append(
                    adv_fns.transform_rewards(
                        rewards_per_func[:, i],
                        clip=args.reward_clip,
                        norm=args.reward_norm,
                        shift_only=args.reward_shift,
                        scale_only=args.reward_scale,
                        state=state,
                    )
                )
            rewards_per_func = torch.stack(columns, dim=1)
        self._scored_rewards = rewards_per_func
        return rewards_per_func

    def _init_training_state(
        self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
    ):
        """transformers' resume position, except with a batch stream: transformers assumes one generation batch
        per step, so resume at the stream's saved epoch (the next one if it had run out) with no batch to skip;
        the stream skips the items the epoch had consumed (`get_batch_samples`)."""
        epochs_trained, steps_trained = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        if self._batch_stream is None or self.state.global_step == 0 or self.args.ignore_data_skip:
            return epochs_trained, steps_trained
        self._batch_stream.load_state_dict(load_stream_state(resume_from_checkpoint, self.state.global_step))
        self._resumed_from = resume_from_checkpoint
        return self._batch_stream.epoch, 0

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """transformers' prefetch of one optimizer step; dynamic sampling and selective rollout read more from the
        same iterator, so the stream counts every pull (on resume, it first skips what the saved epoch had read)."""
        if self._batch_stream is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        skipped = self._batch_stream.enter(epoch_iterator)
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._batch_stream.note_pulled(len(batch_samples), num_batches)
        if skipped:  # the epoch iterator drew from the RNG: restore it, as transformers does after a skip
            self._load_rng_state(self._resumed_from)
        return batch_samples, num_items_in_batch

    # --- seam 2: the scored batch ---
    def _generate_and_score_completions(self, inputs):
        if self.model.training and self._dynamic_sampler is not None:
            return self._dynamic_sampler.collect(inputs)  # refill rounds, then the filter over all of them
        output, zero = self._score_round(inputs)
        if self.model.training and self.args.filter_zero_signal:
            rank = self.accelerator.process_index
            output = self._drop_rows(output, ~zero[rank * len(inputs) : (rank + 1) * len(inputs)])
        return output

    def _score_round(self, inputs):
        """TRL's scored batch with grpo_hub's edits (no row dropped), and the (all ranks' rows,) zero-signal mask."""
        mode = "train" if self.model.training else "eval"
        if mode == "train" and self._selector is not None:  # GRESO: skip predicted zero-signal prompts
            inputs = self._selector.select(inputs)
        check_batch_prompts(inputs, environment_prompts=self.environment_factories is not None)
        output = super()._generate_and_score_completions(inputs)
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        rank_rows = slice(
            self.accelerator.process_index * len(inputs), (self.accelerator.process_index + 1) * len(inputs)
        )
        rewards_per_func, self._scored_rewards = self._scored_rewards, None
        rewards = self._weighted_rewards(rewards_per_func)
        if mode == "train" and self._selector is not None:
            self._selector.record(rewards)
        if self.args.recomputes_advantages:
            output["advantages"] = self._recompute_advantages(rewards, output, group_size, rank_rows)
        if self._turn_credit is not None:
            norm = "mean_only" if self.scale_rewards == "none" else "mean_std"
            output["advantages"] = self._turn_credit.assign(
                output, rewards_per_func, group_size, rank_rows, norm, self._metrics[mode]
            )
        if self.args.vllm_is_pooling == "mean" and "importance_sampling_ratio" in output:
            output["importance_sampling_ratio"] = self._geometric_is_ratio(output)
        if self.vllm_importance_sampling_correction:
            log_is_diagnostics(
                output,
                self._metrics[mode],
                self._gather,
                settings=is_settings(self.vllm_importance_sampling_mode, self.args.vllm_is_pooling),
                low=self.vllm_importance_sampling_clip_min,
                high=self.vllm_importance_sampling_clip_max,
            )
        self._log_advantages(output["advantages"], mode)
        self._log_zero_signal_kinds(rewards, group_size, mode)
        zero = adv_fns.zero_signal_mask(rewards, group_size, self.args.zero_signal_eps)
        return output, zero.to(output["advantages"].device)

    def _log_zero_signal_kinds(self, rewards: torch.Tensor, group_size: int, mode: str) -> None:
        """Share of groups (all ranks) that are zero-signal at the top / bottom of the rewards seen so far."""
        scored = rewards[~torch.isnan(rewards)]
        if scored.numel():
            low, high = self._reward_range
            self._reward_range = (min(low, scored.min().item()), max(high, scored.max().item()))
        kinds = adv_fns.zero_signal_kinds(rewards, group_size, self.args.zero_signal_eps, *self._reward_range)
        for kind, name in adv_fns.KIND_NAMES.items():
            self._metrics[mode][f"zero_signal/frac_groups_{name}"].append(
                (kinds == kind).double().mean().item()
            )

    def _weighted_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """TRL's scalar reward: weighted nansum of the reward functions, NaN where none scored the row."""
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        return rewards.masked_fill(torch.isnan(rewards_per_func).all(dim=1), torch.nan)

    def _recompute_advantages(self, rewards, output, group_size, rank_rows) -> torch.Tensor:
        """Advantages over all ranks' rows from the (transformed) rewards; returns this rank's slice."""
        args = self.args
        if args.token_level_kl_coef > 0:
            rewards = rewards - args.token_level_kl_coef * self.accelerator.gather(self._sequence_kl(output))
        norm = args.adv_norm or ("mean_only" if self.scale_rewards == "none" else "mean_std")
        scope = "batch" if self.scale_rewards == "batch" else "group"
        advantages = adv_fns.group_advantages(rewards, group_size, norm=norm, std_scope=scope)
        if args.whiten_advantages:
            advantages = adv_fns.whiten(advantages, ~torch.isnan(rewards))
        if args.adv_clip_range is not None:
            advantages = adv_fns.clip_advantages(advantages, args.adv_clip_range)
        return advantages[rank_rows]

    @torch.no_grad()
    def _sequence_kl(self, output) -> torch.Tensor:
        """(B,) sum over loss tokens of log pi_old - log pi_ref (k1, verl's use_kl_in_reward)."""
        mask = output["completion_mask"] * output.get("tool_mask", 1)
        old = output.get("old_per_token_logps")
        old = self._score_logps(output, use_reference=False) if old is None else old
        ref = output.get("ref_per_token_logps")
        ref = self._score_logps(output, use_reference=True) if ref is None else ref
        return (losses.kl_penalty(old, ref, kind="k1") * mask).sum(dim=1)

    def _score_logps(self, output, use_reference: bool) -> torch.Tensor:
        """No-grad per-token log-probs of the policy, or of the PEFT base/"ref" adapter, on the scored rows."""
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        logits_to_keep = output["completion_ids"].size(1)

        def forward():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=self.args.per_device_train_batch_size,
            )
            return logps

        if not use_reference:
            return forward()
        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return forward()

    def _geometric_is_ratio(self, output) -> torch.Tensor:
        """Sequence IS weight from the geometric mean of token ratios (TRL uses their product)."""
        mask = output["completion_mask"] * output.get("tool_mask", 1)
        mode = "truncate" if self.vllm_importance_sampling_mode.endswith("truncate") else "mask"
        weights = importance.rollout_is_weights(  # a NaN sampler logprob: ratio 1, left out of the mean
            output["old_per_token_logps"],
            output["sampling_per_token_logps"],
            mask,
            level="sequence",
            pooling="mean",
            mode=mode,
            low=self.vllm_importance_sampling_clip_min,
            high=self.vllm_importance_sampling_clip_max,
        )
        self._metrics["train" if self.model.training else "eval"]["sampling/is_ratio_geometric/mean"].append(
            self.accelerator.gather(weights.float().mean()).mean().item()
        )
        return weights

    def _log_advantages(self, advantages: torch.Tensor, mode: str) -> None:
        """Check (all ranks raise together) and log the advantages of the whole generation batch."""
        everything = self.accelerator.gather(advantages.detach().reshape(-1).float())
        check_advantages_finite(everything)
        metrics = self._metrics[mode]
        metrics["advantages/mean"].append(everything.mean().item())
        metrics["advantages/std"].append(everything.std().item() if everything.numel() > 1 else 0.0)
        metrics["advantages/max_abs"].append(everything.abs().max().item())

    def _drop_rows(self, output: dict, keep: torch.Tensor) -> dict:
        """Keep this rank's signal rows, padded to the row count all ranks agree on (see `algos.filtering`)."""
        args = self.args
        counts = self.accelerator.gather(torch.tensor([int(keep.sum()), keep.numel()], device=keep.device))
        counts = counts.view(-1, 2)
        num_rows = agreed_row_count(int(counts[:, 0].max()), args.steps_per_generation)
        output = keep_rows(output, keep, num_rows, self.pad_to_multiple_of)
        kept_rows, all_rows = int(counts[:, 0].sum()), int(counts[:, 1].sum())
        steps_total = args.steps_per_generation * self.accelerator.num_processes
        if args.zero_signal_normalizer == "kept":
            loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
            output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
            rows_per_step = kept_rows / steps_total
        else:
            rows_per_step = all_rows / steps_total
        # 0-dim, so TRL's split/shuffle hand it unchanged to every micro-batch.
        output["rows_per_step"] = torch.tensor(max(rows_per_step, 1e-8), device=keep.device)
        metrics = self._metrics["train"]
        metrics["filter/frac_rows_dropped"].append(1.0 - kept_rows / all_rows)
        metrics["filter/rows_trained"].append(float(kept_rows))
        metrics["filter/rows_padded"].append(float(num_rows * self.accelerator.num_processes - kept_rows))
        return output

    # --- packing: run fewer, fuller micro-steps when rows were dropped ---
    def training_step(self, model, inputs, num_items_in_batch):
        """TRL's step; with `zero_signal_pack`, a micro-step the packing plan leaves empty runs nothing.

        The plan (`algos.filtering.packing_plan`) is the same on every rank and always runs the micro-step
        that ends an optimizer step, so DDP's gradient reduction and DeepSpeed's step happen as usual.
        """
        if not self.args.packs_rows:
            return super().training_step(model, inputs, num_items_in_batch)
        model.train()  # TRL's _prepare_inputs reads the mode; transformers sets it inside training_step
        micro_batch = self._prepare_inputs(inputs)  # generates when due, on every rank
        if micro_batch is None:
            if self.accelerator.sync_gradients:
                raise RuntimeError("packing plan skipped the micro-step that ends an optimizer step")
            self._step += 1
            self._window_position += 1
            return torch.zeros((), device=self.args.device)
        self._ready_micro_batch = micro_batch
        loss = super().training_step(model, micro_batch, num_items_in_batch)
        self._window_position = 0 if self.accelerator.sync_gradients else self._window_position + 1
        return loss

    def _prepare_inputs(self, generation_batch):
        if generation_batch is self._ready_micro_batch:  # already packed by training_step
            self._ready_micro_batch = None
            return generation_batch
        if not (self.args.packs_rows and self.model.training):
            return super()._prepare_inputs(generation_batch)
        buffer = self._buffered_inputs
        super()._prepare_inputs(generation_batch)
        if self._buffered_inputs is not buffer:  # TRL generated and buffered a new generation batch
            self._plan_packing()
        entry = self._packing_plan[self._step % len(self._packing_plan)]
        if entry is None:
            return None
        slots, chunk, chunks, num_rows = entry
        segment = concat_micro_batches([self._buffered_inputs[slot] for slot in slots])
        carrying = segment["completion_mask"].any(dim=1).nonzero().squeeze(1)
        keep = torch.zeros_like(segment["completion_mask"][:, 0], dtype=torch.bool)
        keep[carrying[packed_rows(carrying.numel(), chunk, chunks)]] = True
        return keep_rows(segment, keep, num_rows, self.pad_to_multiple_of)  # same row count on every rank

    def _plan_packing(self) -> None:
        """Agree (one all-gather) on the packing plan of the buffered generation batch; log micro-steps run."""
        rows = torch.stack([b["completion_mask"].any(dim=1).sum() for b in self._buffered_inputs])
        rows = self._gather(rows.unsqueeze(0)).cpu()
        self._packing_plan = packing_plan(
            rows,
            self.num_iterations,
            self.args.gradient_accumulation_steps,
            self._window_position,
            self.args.per_device_train_batch_size,
        )
        runs = sum(entry is not None for entry in self._packing_plan)
        self._metrics["train"]["filter/micro_steps_run"].append(float(runs))

    @staticmethod
    def _row_scale(inputs, rows_averaged) -> float:
        """Rescale a mean over `rows_averaged` rows of a micro-batch to the filtering normaliser's row count."""
        if "rows_per_step" not in inputs:
            return 1.0
        return rows_averaged / inputs["rows_per_step"]

    # --- seam 3: the loss ---
    def _compute_loss(self, model, inputs):
        if self.args.uses_own_loss:
            return self._own_loss(model, inputs)
        loss = super()._compute_loss(model, inputs)
        if self.loss_type in ROW_MEAN_LOSSES:
            loss = loss * self._row_scale(inputs, inputs["prompt_ids"].shape[0])  # TRL averages over all rows
        return loss

    def _own_loss(self, model, inputs):
        """Clipped (or CISPO) surrogate with turn/token/sequence ratio pooling and `loss_agg_mode`."""
        args, mode = self.args, ("train" if self.model.training else "eval")
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        mask = completion_mask * inputs.get("tool_mask", 1)
        per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([inputs["prompt_ids"], completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], completion_mask], dim=1),
            completion_ids.size(1),
            compute_entropy=True,
        )
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        old_logps = inputs.get("old_per_token_logps")
        old_logps = per_token_logps.detach() if old_logps is None else old_logps
        level = self.importance_sampling_level
        tool_mask = inputs.get("tool_mask", torch.ones_like(completion_mask))  # no tool call: one turn
        turn_ids = turn_ids_from_tool_mask(tool_mask) if level == "turn" else None
        log_ratio = losses.pool_log_ratio(per_token_logps - old_logps, mask, level=level, turn_ids=turn_ids)
        ratio = torch.exp(log_ratio)
        if self.loss_type == "cispo":
            per_token_loss = losses.cispo_loss(ratio, advantages, per_token_logps, high=self.epsilon_high)
        else:
            per_token_loss = losses.clipped_surrogate(
                ratio, advantages, self.epsilon_low, self.epsilon_high, dual_clip=args.dual_clip_c
            )
        if "importance_sampling_ratio" in inputs:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        if self.beta != 0.0:
            per_token_kl = losses.kl_penalty(per_token_logps, inputs["ref_per_token_logps"], kind="k3")
            if args.use_bias_correction_kl:
                per_token_kl = per_token_kl * ratio
            per_token_loss = per_token_loss + self.beta * per_token_kl
        loss = self._aggregate(per_token_loss, mask, inputs, mode)
        self._log_own_loss_metrics(
            ratio, advantages, mask, entropies, per_token_kl if self.beta else None, mode
        )
        return loss

    def _aggregate(self, per_token_loss, mask, inputs, mode) -> torch.Tensor:
        """`loss_agg_mode` (default: grpo -> seq-mean-token-mean, dapo/cispo -> token-mean) for one micro-batch.

        token-mean divides by the loss tokens of the whole generation batch on all ranks (DAPO's normaliser,
        `num_items_in_batch`), so it does not depend on how rows fall into micro-batches. Seq-mean modes are
        means over rows, rescaled to the filtering normaliser's row count when rows were dropped.
        """
        agg_mode = self.args.loss_agg_mode or (
            "seq-mean-token-mean" if self.loss_type == "grpo" else "token-mean"
        )
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        loss = losses.aggregate_loss(per_token_loss, mask, agg_mode, norm_length=self.max_completion_length)
        if agg_mode in losses.SEQ_MEAN_AGG_MODES:
            rows_averaged = (mask.sum(dim=1) > 0).sum().clamp(min=1)  # aggregate_loss skips empty rows
            return loss * self._row_scale(inputs, rows_averaged) / accumulation
        tokens_per_step = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            tokens_per_step = tokens_per_step / self.args.steps_per_generation
        return loss * mask.sum().clamp(min=1.0) / tokens_per_step / accumulation

    def _log_own_loss_metrics(self, ratio, advantages, mask, entropies, per_token_kl, mode) -> None:
        def global_mean(x):
            x = x.expand_as(mask)
            totals = self.accelerator.reduce(
                torch.stack([(x * mask).sum(), mask.sum().float()]), reduction="sum"
            )
            return (totals[0] / totals[1].clamp(min=1.0)).item()

        metrics = self._metrics[mode]
        metrics["entropy"].append(global_mean(entropies))
        if per_token_kl is not None:
            metrics["kl"].append(global_mean(per_token_kl))
        ratio = ratio.detach()
        if self.loss_type == "cispo":
            metrics["cispo_clip_ratio"].append(
                global_mean(((ratio > self.epsilon_high) & (advantages > 0)).float())
            )
            return
        low = (ratio < 1 - self.epsilon_low) & (advantages < 0)
        high = (ratio > 1 + self.epsilon_high) & (advantages > 0)
        metrics["clip_ratio/low_mean"].append(global_mean(low.float()))
        metrics["clip_ratio/high_mean"].append(global_mean(high.float()))
        metrics["clip_ratio/region_mean"].append(global_mean((low | high).float()))
        if self.args.dual_clip_c is not None:
            dual = (ratio > self.args.dual_clip_c) & (advantages < 0)
            metrics["clip_ratio/dual_mean"].append(global_mean(dual.float()))
