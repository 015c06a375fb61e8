"""`HubPushCallback`: push every saved checkpoint as its own branch and the final adapter to `main`.

On the main process only: `on_train_begin` checks the token and creates the repo (a bad token fails before
training, not after it); `on_save` pushes `checkpoint-<N>` to branch `step-<N>`; `on_train_end` saves the
trained adapter (only it, never TRL's "ref" adapter; gathered from every rank under ZeRO-3) with the
tokenizer to a temporary folder and pushes it to `main`. Each push is one commit; `pushed` lists their
`PushResult`s in order.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from transformers import TrainerCallback

from grpo_hub.hub.push import PushResult, check_branch, check_repo_id, create_adapter_repo, push_adapter
from grpo_hub.records.run_record import run_record
from grpo_hub.training.distributed import gathered, unwrap_peft_model


class HubPushCallback(TrainerCallback):
    """Push checkpoints to `branch_template.format(step=N)` and the final adapter to `final_revision`."""

    def __init__(
        self,
        repo_id: str,
        *,
        base_model: str | None = None,
        token: str | None = None,
        private: bool | None = None,
        push_checkpoints: bool = True,
        branch_template: str = "step-{step}",
        final_revision: str = "main",
        adapter_name: str = "default",
    ):
        check_repo_id(repo_id)
        check_branch(branch_template.format(step=1))
        check_branch(final_revision)
        self.repo_id, self.base_model, self.token, self.private = repo_id, base_model, token, private
        self.push_checkpoints, self.branch_template = push_checkpoints, branch_template
        self.final_revision, self.adapter_name = final_revision, adapter_name
        self.pushed: list[PushResult] = []

    @classmethod
    def for_run(cls, args, model_name: str) -> HubPushCallback:
        """`--push_to_hub` of a run with training arguments `args`: grpo_hub's adapter-only pushes (checkpoint-N ->
        branch step-N, final -> main) replace Trainer's own (`args.push_to_hub` is turned off), which would upload
        the whole output folder (ref adapter, training_args.bin)."""
        if not args.hub_model_id:
            raise ValueError("--push_to_hub needs --hub_model_id (e.g. your-name/tiny-grpo-lora).")
        args.push_to_hub = False
        return cls(
            args.hub_model_id,
            base_model=model_name,
            token=args.hub_token,
            private=args.hub_private_repo,
            push_checkpoints=args.save_strategy != "no",
        )

    def _push(self, folder, revision: str, args, state, message: str) -> None:
        self.pushed.append(
            push_adapter(
                folder,
                self.repo_id,
                revision=revision,
                base_model=self.base_model,
                record=run_record(args, state.log_history, state.global_step, self.base_model),
                token=self.token,
                private=self.private,
                commit_message=message,
                adapter_name=self.adapter_name,
            )
        )

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.repo_id = create_adapter_repo(self.repo_id, token=self.token, private=self.private)

    def on_save(self, args, state, control, **kwargs):
        if not (state.is_world_process_zero and self.push_checkpoints):
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        revision = self.branch_template.format(step=state.global_step)
        self._push(folder, revision, args, state, f"Checkpoint at step {state.global_step}")

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        peft_model = unwrap_peft_model(model)
        if not hasattr(peft_model, "peft_config"):
            raise ValueError(
                "HubPushCallback pushes LoRA adapters but the trained model is not a PeftModel. "
                "Fix: train with `peft_config=LoraConfig(...)` (or a PeftModel), or push the full model yourself."
            )
        adapter = [p for name, p in peft_model.named_parameters() if f".{self.adapter_name}." in name]
        with tempfile.TemporaryDirectory(prefix="grpo-hub-final-") as folder:
            with gathered(adapter):  # ZeRO-3: every rank joins the gather, rank 0 saves the full tensors
                if state.is_world_process_zero:
                    peft_model.save_pretrained(folder, selected_adapters=[self.adapter_name])
            if not state.is_world_process_zero:
                return
            if processing_class is not None:
                processing_class.save_pretrained(folder)
            self._push(
                folder, self.final_revision, args, state, f"Final adapter after {state.global_step} steps"
            )
