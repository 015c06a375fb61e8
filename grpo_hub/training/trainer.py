"""GRPOHubTrainer: `trl.GRPOTrainer` with grpo_hub's features wired through TRL's seams; only the seams live here.

The seams, in the order TRL 1.16 and transformers call them for one generation batch (full account:
docs/architecture.md): `get_batch_samples` (the batch stream counts pulls), `training_step` (packing),
`_prepare_inputs` (TRL scores, shuffles, splits, buffers; whole groups re-split it; filtering drops marked rows),
`_generate_and_score_completions` (dynamic sampling's rounds, `_score_round` each: our edits after TRL's scored
batch), `_tokenize_prompts` (hints), `_calculate_rewards` (checks, clip / norm, hints), `_compute_loss` (TRL's loss
rescaled, or `training.own_loss`).
Every formula lives in `grpo_hub.algos`; the helpers get narrow inputs from here. Nothing here copies TRL code.
"""

import copy
import functools

import torch
from accelerate.utils import broadcast_object_list, gather_object, is_peft_model
from trl import GRPOTrainer

from grpo_hub.algos import advantages as adv_fns
from grpo_hub.algos.loss_denominator import batch_counts, micro_batch_denominator
from grpo_hub.algos.shared_prompts import whole_group_micro_batches
from grpo_hub.config import features
from grpo_hub.config.hub_config import GRPOHubConfig
from grpo_hub.generation import loss_time_is
from grpo_hub.generation.is_diagnostics import edit_is_weights
from grpo_hub.records.model_card import write_run_files
from grpo_hub.training import filtering, hints, padding_free, rollout_budget, scored_batch, vllm_wiring
from grpo_hub.training.batch_stream import BatchStreamCallback, GenerationBatchStream
from grpo_hub.training.compat import check_trl_seams
from grpo_hub.training.dynamic_sampling import DynamicSampler
from grpo_hub.training.finite_guard import FiniteGradientsCallback
from grpo_hub.training.input_checks import (
    check_batch_prompts,
    check_rewards_finite,
    check_trainer_options,
    checked_args,
    checked_reward_funcs,
    named_datasets,
)
from grpo_hub.training.own_loss import OwnLossSettings, own_loss
from grpo_hub.training.packing import MicroStepPacker
from grpo_hub.training.reference import attach_reference_adapter, strip_reference_adapter
from grpo_hub.training.selective_rollout import SelectiveRollout, checkpointed, signature_columns
from grpo_hub.training.time_budget import TimeBudgetCallback
from grpo_hub.training.turns import TurnCredit

check_trl_seams(GRPOTrainer)


class GRPOHubTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` that also honours every `GRPOHubConfig` field; with defaults it is TRL's trainer."""

    def __init__(self, model, reward_funcs=None, args: GRPOHubConfig | None = None, **kwargs):
        args = checked_args(model, args)  # None: TRL's default, as a GRPOHubConfig
        with vllm_wiring.building(args, model, kwargs.get("peft_config")):  # TRL builds its vLLM generation
            super().__init__(model, reward_funcs, args=args, **kwargs)
        # asynchronous rollouts (max_staleness > 0); vLLM's IS ratio from the training forward (where exact)
        self._rollouts = self._loss_time_is = None
        if args.use_vllm:  # the weight sync, the server checks, the IS ratio's path (training.vllm_wiring)
            acc, broadcast = self.accelerator, functools.partial(broadcast_object_list, from_process=0)
            self._rollouts = vllm_wiring.prepare(
                args, self.model, self.vllm_generation, num_generations=self.num_generations,
                use_loss_time_is=self._use_loss_time_is, print_line=functools.partial(acc.print, flush=True),
                add_callback=self.add_callback,
                collectives=(gather_object, broadcast, acc.process_index, acc.is_main_process),
                metrics=self._metrics["train"],
            )  # fmt: skip
        multi_turn = any(kwargs.get(k) is not None for k in ("tools", "environment_factory", "rollout_func"))
        check_trainer_options(
            args, multi_turn=multi_turn, is_vlm=self._is_vlm, has_reference=self.beta != 0.0 or is_peft_model(self.model),
            datasets=named_datasets(self.train_dataset, self.eval_dataset),
        )  # fmt: skip
        # packed forwards of the real tokens only, with shared_prompts each prompt once for its rows (training.padding_free)
        self._padding_free = padding_free.trainer_forward(
            args, self.model, self.ref_model, self._tokenizer.pad_token_id, self.accelerator.autocast
        )
        self.add_callback(FiniteGradientsCallback())  # weights never become NaN/inf
        self._reference_callback = attach_reference_adapter(self)  # frozen 'ref' adapter + refresh
        # TRL scores with these while `_calculate_rewards` runs; `reward_funcs` keeps the user's own functions
        self._checked_reward_funcs = checked_reward_funcs(self.reward_funcs, self.reward_func_names)
        self._reward_transform = scored_batch.RewardTransform(args, len(self.reward_funcs))
        self._scored_rewards = None  # rewards_per_func of the batch being scored (all ranks)
        self._zero_signal_kinds = scored_batch.ZeroSignalKinds(args.zero_signal_eps)  # top/bottom rewards
        self._batch_stream = None  # the epoch read in generation batches, for refills and replacements
        if args.dynamic_sampling or args.selective_rollout or self._rollouts is not None:
            self._batch_stream = GenerationBatchStream(args.steps_per_generation * self.num_iterations)
            self.add_callback(BatchStreamCallback(self._batch_stream))
        acc = self.accelerator  # what the features below share: this rank, the group size, the train metrics
        wiring = dict(rank=acc.process_index, group_size=self.num_generations, metrics=self._metrics["train"])
        self._dynamic_sampler = self._selector = self._budgets = None
        self._state_callbacks = []  # features whose state is saved in each checkpoint (training.checkpoint_state)
        if args.dynamic_sampling:  # rounds until enough groups have signal (training.dynamic_sampling)
            self._dynamic_sampler = DynamicSampler.from_config(
                args, score_round=self._score_round, gather=self._gather, num_processes=acc.num_processes,
                pad_to_multiple_of=self.pad_to_multiple_of, pad_token_id=self._tokenizer.pad_token_id,
                stream=self._batch_stream, **wiring,
            )  # fmt: skip
        if args.selective_rollout:  # GRESO: skips predicted zero-signal prompts (training.selective_rollout)
            self._selector = SelectiveRollout.from_config(
                args, stream=self._batch_stream, gather_objects=gather_object, gather=self._gather,
                num_processes=acc.num_processes, **wiring,
            )  # fmt: skip
            self._state_callbacks.append(checkpointed(self._selector))
        if features.is_on("rollout_budget", args):  # per-prompt rollout budgets (training.rollout_budget)
            self._budgets = rollout_budget.RolloutBudgets.from_config(
                args, gather_objects=gather_object, **wiring
            )
            self._state_callbacks.append(rollout_budget.checkpointed(self._budgets))
        self._hints = hints.from_config(args, self._tokenizer, gather_object, self.train_dataset, **wiring)
        self._state_callbacks += [hints.checkpointed(self._hints)] if self._hints is not None else []
        for callback in self._state_callbacks:
            self.add_callback(callback)
        self._packer = None  # packing state (training.packing), under filtering with zero_signal_pack
        if args.packs_rows:
            self._packer = MicroStepPacker.from_config(
                args, self._gather, self.num_iterations, self.pad_to_multiple_of, self._metrics["train"]
            )
        self._loss_settings = OwnLossSettings(  # the own loss path's settings: TRL's values resolved in its __init__
            self.loss_type, args.loss_agg_mode, self.importance_sampling_level, self.epsilon_low, self.epsilon_high,
            args.dual_clip_c, self.beta, args.use_bias_correction_kl, self.max_completion_length,
        )  # fmt: skip
        self._time_budget = None  # the run's length planned to a wall-clock budget (training.time_budget)
        if features.is_on("time_budget", args):
            self._time_budget = TimeBudgetCallback.from_config(args, acc.device, self._metrics["train"])
            self.add_callback(self._time_budget)
        self._turn_credit = None  # per-turn advantages (training.turns)
        if args.turn_advantages:
            funcs, names, weights = self.reward_funcs, self.reward_func_names, self.reward_weights
            self._turn_credit = TurnCredit(funcs, names, weights, args.turn_advantages, self._gather)

    def _is_settings(self) -> dict:
        """TRL's vLLM IS mode and bounds with grpo_hub's pooling (`generation.is_diagnostics.is_settings`)."""
        return dict(trl_mode=self.vllm_importance_sampling_mode, pooling=self.args.vllm_is_pooling,
                    low=self.vllm_importance_sampling_clip_min, high=self.vllm_importance_sampling_clip_max)  # fmt: skip

    def _use_loss_time_is(self, on: bool) -> None:
        """Take vLLM's IS ratio from the training forward (`on`: where exact) instead of TRL's scoring forward."""
        settings = dict(**self._is_settings(), gather=self._gather, metrics=self._metrics["train"])
        self._loss_time_is = loss_time_is.LossTimeIS(**settings) if on else None
        if on:
            self.add_callback(loss_time_is.FlushCallback(self._loss_time_is))

    def _next_async_batch(self, inputs, prepare):
        """max_staleness > 0: sync the server to this step's policy (TRL's own check), then the oldest launched batch
        (`AsyncRollouts.next_batch`; `prepare`: the hints of a batch read ahead, or None); `prompt_ids` are the token
        ids TRL's `_generate` sends for a batch."""
        if self._last_loaded_step != self.state.global_step:
            self.vllm_generation.sync_weights()
            self._last_loaded_step = self.state.global_step
        prompt_ids = lambda rows: self._tokenize_prompts(copy.deepcopy([x["prompt"] for x in rows]))[0]  # noqa: E731
        return self._rollouts.next_batch(
            inputs, self.state.global_step, self._batch_stream, prompt_ids, prepare
        )

    def _tokenize_prompts(self, prompts: list):
        """TRL's prompt ids; a hinted prompt's hint follows as the answer's start (training.hints)."""
        tokenize = super()._tokenize_prompts
        return tokenize(prompts) if self._hints is None else self._hints.prompt_ids(prompts, tokenize)

    def _set_signature_columns_if_needed(self):
        """TRL's kept columns (`remove_unused_columns=True`), plus the selective-rollout id and hint columns."""
        super()._set_signature_columns_if_needed()
        args = self.args
        extra = (args.selective_rollout_id_column, args.hint_column, args.hint_group_column)
        self._signature_columns = signature_columns(self._signature_columns, *extra)

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` of every rank, concatenated along dim 0 (moved to this rank's device first)."""
        return self.accelerator.gather(tensor.to(self.accelerator.device))

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """transformers' scheduler; with `time_budget_seconds` the length of one it creates (not one passed in
        `optimizers`) is re-planned as the run goes."""
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if self._time_budget is not None and self._created_lr_scheduler:
            self._time_budget.scheduler = scheduler
        return scheduler

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """TRL's train; a checkpoint folder given here also restores every feature's state saved in it."""
        folder = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None
        for callback in (*self._state_callbacks, self._reference_callback, self._time_budget):
            if callback is not None:
                callback.resume_from = folder
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """TRL's save, without PEFT's frozen `ref/` adapter folder unless `ref_adapter_save` (grpo_hub.training.reference);
        a LoRA save also gets the model card, reward curve and run record (grpo_hub.records.model_card)."""
        super().save_model(output_dir, _internal_call)
        if not self.args.ref_adapter_save and self.args.should_save:
            strip_reference_adapter(output_dir or self.args.output_dir)
        if self.args.should_save and is_peft_model(self.model):  # the card and run record a push reads
            base = getattr(self.model.config, "_name_or_path", None)
            write_run_files(output_dir or self.args.output_dir, self.args, self.state, base)

    # --- seam 1: rewards ---
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        funcs, self.reward_funcs = self.reward_funcs, self._checked_reward_funcs
        hinted = self._hints is not None and self.model.training  # hint-guided rollouts (training.hints)
        if hinted:  # the whole answer: hint + completion
            prompts, completions = self._hints.for_rewards(inputs, prompts, completions)
        try:  # each reward function's output is checked before TRL reads it (input_checks)
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        finally:
            self.reward_funcs = funcs
        check_rewards_finite(rewards_per_func, self.reward_func_names)
        if hinted:  # right answers update each prompt's hint length
            self._hints.record(inputs, scored_batch.weighted_rewards(rewards_per_func, self.reward_weights))
        if self._reward_transform.active:  # reward_clip / reward_norm (training.scored_batch)
            training, weights = self.model.training, self.reward_weights
            metrics = self._metrics["train" if training else "eval"]
            rewards_per_func = self._reward_transform(rewards_per_func, training, weights, metrics)
        self._scored_rewards = rewards_per_func
        return rewards_per_func

    def _init_training_state(
        self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
    ):
        """transformers' resume position, except with a batch stream: transformers assumes one generation batch
        per step, so resume at the stream's saved epoch (the next one if it had run out) with no batch to skip;
        the stream skips the items the epoch had consumed (`get_batch_samples`)."""
        position = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        if self._batch_stream is None or self.state.global_step == 0 or self.args.ignore_data_skip:
            return position
        return self._batch_stream.resume(resume_from_checkpoint, self.state.global_step)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """transformers' prefetch of one optimizer step; dynamic sampling and selective rollout read more from the
        same iterator, so the stream counts every pull (on resume, it first skips what the saved epoch had read)."""
        if self._batch_stream is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        pull = functools.partial(super().get_batch_samples, epoch_iterator, num_batches, device)
        return self._batch_stream.pull(epoch_iterator, num_batches, pull, self._load_rng_state)

    # --- seam 2: the scored batch ---
    def _generate_and_score_completions(self, inputs):
        if self.model.training and self._dynamic_sampler is not None:
            output = self._dynamic_sampler.collect(inputs)  # refill rounds, then the filter over all of them
        else:
            output, zero = self._score_round(inputs)
            if self.model.training and self.args.filter_zero_signal:  # dropped after TRL's shuffle and split
                filtering.mark_signal_rows(output, zero, self.accelerator.process_index)
        if self.model.training and self._selector is not None:
            self._selector.end_step()  # GRESO adapts its exploration once per optimizer step
        return output

    def _score_round(self, inputs):
        """TRL's scored batch with grpo_hub's edits (no row dropped), and the (all ranks' rows,) zero-signal mask."""
        mode = "train" if self.model.training else "eval"
        if mode == "train" and self._selector is not None:  # GRESO: skip predicted zero-signal prompts
            inputs = self._selector.select(inputs)
        if mode == "train" and self._budgets is not None:  # each prompt its own number of completions
            inputs = self._budgets.assign(inputs)
        hint = self._hints.at_step(self.state) if mode == "train" and self._hints is not None else None
        inputs = hint(inputs) if hint else inputs  # hard prompts start from their solution's first steps
        if mode == "train" and self._rollouts is not None:  # asynchronous: train the oldest launched batch
            inputs = self._next_async_batch(inputs, hint)
        check_batch_prompts(inputs, environment_prompts=self.environment_factories is not None)
        in_loss = self._loss_time_is if mode == "train" else None  # vLLM IS ratio from the training forward
        with loss_time_is.scoring_without_ratio(self, in_loss):
            output = super()._generate_and_score_completions(inputs)
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        if mode == "train" and self._budgets is not None:
            group_size = self._budgets.sizes
        rank, rows = self.accelerator.process_index, len(inputs)
        rank_rows = slice(rank * rows, (rank + 1) * rows)
        rewards_per_func, self._scored_rewards = self._scored_rewards, None
        rewards = scored_batch.weighted_rewards(rewards_per_func, self.reward_weights)
        if mode == "train" and self._selector is not None:
            self._selector.record(rewards)
        if self.args.recomputes_advantages:
            output["advantages"] = self._recompute_advantages(rewards, output, group_size, rank_rows)
        if self._turn_credit is not None:
            norm = "mean_only" if self.scale_rewards == "none" else "mean_std"
            output["advantages"] = self._turn_credit.assign(
                output, rewards_per_func, group_size, rank_rows, norm, self._metrics[mode]
            )
        if self.vllm_importance_sampling_correction and in_loss is None:
            edit_is_weights(output, self._metrics[mode], self._gather, **self._is_settings())
        everything = self.accelerator.gather(output["advantages"].detach().reshape(-1).float())
        scored_batch.log_advantages(everything, self._metrics[mode])
        if mode == "train" and self._budgets is not None:  # the prompts' history; TRL's logs per group
            self._budgets.record(rewards, everything, self._logs["advantages"])
        self._zero_signal_kinds.log(rewards, group_size, self._metrics[mode])
        zero = adv_fns.zero_signal_mask(rewards, group_size, self.args.zero_signal_eps)
        return output, zero.to(output["advantages"].device)

    def _recompute_advantages(self, rewards, output, group_size, rank_rows) -> torch.Tensor:
        """Advantages over all ranks' rows from the (transformed) rewards; returns this rank's slice."""
        kl = None
        if features.is_on("kl_in_reward", self.args):  # every rank's rows, as the rewards
            batch_size = self.args.per_device_train_batch_size
            score = functools.partial(
                scored_batch.rescored_logps, output, peft_model=self.accelerator.unwrap_model(self.model),
                per_token_logps=lambda *a: self._get_per_token_logps_and_entropies(self.model, *a, batch_size=batch_size)[0],
            )  # fmt: skip
            kl = self._gather(scored_batch.sequence_kl(output, score))
        advantages = scored_batch.recompute_advantages(rewards, group_size, self.args, self.scale_rewards, kl)
        return advantages[rank_rows]

    # --- packing (training.packing): run fewer, fuller micro-steps when rows were dropped ---
    def training_step(self, model, inputs, num_items_in_batch):
        """TRL's step; with `zero_signal_pack`, a micro-step the packing plan leaves empty runs nothing."""
        if self._packer is None:
            return super().training_step(model, inputs, num_items_in_batch)
        model.train()  # TRL's _prepare_inputs reads the mode; transformers sets it inside training_step
        trl_step = super().training_step
        return self._packer.training_step(
            inputs,
            prepare=self._prepare_inputs,
            run_step=lambda micro_batch: trl_step(model, micro_batch, num_items_in_batch),
            skip_step=lambda: setattr(self, "_step", self._step + 1),  # TRL's buffer index, as its step does
            sync_gradients=lambda: self.accelerator.sync_gradients,
            device=self.args.device,
        )

    def _prepare_inputs(self, generation_batch):
        if not (self.model.training and self.args.filter_zero_signal):
            return self._prepare_trl(generation_batch)
        if self._packer is None:
            return self._prepare_filtered(generation_batch)
        if self._packer.take_ready(generation_batch):  # already packed by training_step
            return generation_batch
        return self._packer.next_micro_batch(
            lambda: self._prepare_filtered(generation_batch),
            lambda: self._buffered_inputs,
            lambda: self._step,
        )

    def _prepare_trl(self, generation_batch):
        """TRL's micro-batch; a buffer TRL has just filled is first re-split with each prompt's rows together."""
        before, block, pad = self._buffered_inputs, self.args.whole_group_block, self.pad_to_multiple_of
        inputs = super()._prepare_inputs(generation_batch)
        if block > 1 and self._buffered_inputs is not before:  # (shared_prompts_whole_groups)
            self._buffered_inputs = whole_group_micro_batches(self._buffered_inputs, block, pad)
            inputs = self._buffered_inputs[self._step % self.args.steps_per_generation]
        return inputs

    def _prepare_filtered(self, generation_batch):
        """TRL's micro-batch; when TRL has just shuffled, split and buffered a new generation batch, the zero-signal
        rows of each buffered micro-batch are dropped first (`filtering.drop_from_new_buffer`)."""
        before, acc = self._buffered_inputs, self.accelerator
        inputs = self._prepare_trl(generation_batch)
        self._buffered_inputs, inputs = filtering.drop_from_new_buffer(
            before, self._buffered_inputs, inputs, gather=acc.gather, num_processes=acc.num_processes,
            pad_to_multiple_of=self.pad_to_multiple_of, metrics=self._metrics["train"],
        )  # fmt: skip
        return inputs

    # --- seam 3: the loss ---
    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **multimodal,
    ):  # fmt: skip
        """TRL's forward, or with `padding_free` the same outputs from a forward of the real tokens only (every
        caller: training, scoring, reference, rescoring)."""
        forward = self._padding_free or super()._get_per_token_logps_and_entropies
        return forward(
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
            **multimodal,
        )  # fmt: skip

    def _compute_loss(self, model, inputs):
        in_loss = self._loss_time_is if self.model.training else None
        with loss_time_is.ratio_from_forward(self, inputs, in_loss):  # vLLM's IS ratio from it, where exact
            loss = self._loss(model, inputs)
        if self._padding_free is not None:  # shares of the tokens computed since the last micro-step
            self._padding_free.log_shares(self._metrics["train" if self.model.training else "eval"])
        return loss

    def _loss(self, model, inputs):
        if self.args.uses_own_loss:
            forward = functools.partial(self._get_per_token_logps_and_entropies, model, compute_entropy=True)
            return own_loss(
                inputs, lambda *a: forward(*a)[:2], self._loss_settings,
                lambda kind, count: self._loss_denominator(inputs, kind, count),
                self._metrics["train" if self.model.training else "eval"],
                lambda x: self.accelerator.reduce(x, reduction="sum"),
            )  # fmt: skip
        loss = super()._compute_loss(model, inputs)
        if "kept_rows" not in inputs:  # no rows dropped: TRL's denominator is the denominator
            return loss
        return filtering.rescale_to_kept_rows(
            loss, inputs, self.args.loss_denominator, self._loss_denominator
        )

    def _loss_denominator(self, inputs, kind, micro_count, filtered=True) -> torch.Tensor:
        """`algos.loss_denominator.micro_batch_denominator` of this micro-batch: `micro_count` is the rows (ROWS) or loss
        tokens its mean ran over; the filtering counts are those `training.filtering` recorded (training only)."""
        train = self.model.training  # the accumulation steps are set by the train loop only
        return micro_batch_denominator(
            kind, train=train, accumulation_steps=self.current_gradient_accumulation_steps if train else 1,
            num_processes=self.accelerator.num_processes, steps_per_generation=self.args.steps_per_generation,
            micro_rows=micro_count, micro_tokens=micro_count,
            filtering=self.args.zero_signal_normalizer if filtered and "kept_rows" in inputs else None,
            **batch_counts(inputs),
        )  # fmt: skip
