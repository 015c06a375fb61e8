"""A feature's state in every checkpoint: `CheckpointedState` saves `owner.state_dict()` (rank 0 writes) and restores
it on resume, so a resumed run continues where the uninterrupted one was (selective rollout, rollout budgets)."""

import os

import torch
from transformers import TrainerCallback

from grpo_hub.training.reference import resume_folder


class CheckpointedState(TrainerCallback):
    """`owner`'s `state_dict()` as `filename` in each checkpoint; `setting` (e.g. "selective_rollout=True") and `what`
    (what would restart empty) name them in the error of a resume that finds no file."""

    def __init__(self, owner, filename: str, setting: str, what: str):
        self.owner, self.filename, self.setting, self.what = owner, filename, setting, what
        self.resume_from: str | None = None  # set by GRPOHubTrainer.train(resume_from_checkpoint=<path>)

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            return
        folder = resume_folder(args, state.global_step, self.resume_from, filename=self.filename)
        if folder is None:
            raise ValueError(
                f"Resuming at step {state.global_step} with {self.setting}, but no {self.filename} was found in the "
                f"resumed checkpoint or {args.output_dir}/checkpoint-{state.global_step}: {self.what} would restart "
                f"empty. Fix: resume from a checkpoint saved by GRPOHubTrainer with {self.setting}, passing its folder "
                "to `trainer.train(resume_from_checkpoint=...)`."
            )
        self.owner.load_state_dict(torch.load(os.path.join(folder, self.filename), weights_only=True))

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            os.makedirs(folder, exist_ok=True)
            torch.save(self.owner.state_dict(), os.path.join(folder, self.filename))
