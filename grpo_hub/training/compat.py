"""Guard the private TRL methods grpo_hub overrides (the TRL version: grpo_hub.config.trl_version)."""

import inspect

from grpo_hub.config.trl_version import SUPPORTED_TRL

# Seams of `trl.GRPOTrainer` that GRPOHubTrainer overrides or calls, with the parameters it relies on.
TRL_SEAMS = {
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_generate_and_score_completions": ["self", "inputs"],
    "_compute_loss": ["self", "model", "inputs"],
    "_get_per_token_logps_and_entropies": ["self", "model", "input_ids", "attention_mask", "logits_to_keep"],
    "_prepare_inputs": ["self", "generation_batch"],  # reads/writes `_buffered_inputs` and `_step` (packing)
    "training_step": ["self", "model", "inputs", "num_items_in_batch"],
    # transformers' Trainer, inherited: the batch stream counts pulls and sets the resume position
    "get_batch_samples": ["self", "epoch_iterator", "num_batches", "device"],
    "_init_training_state": [
        "self",
        "max_steps",
        "num_update_steps_per_epoch",
        "num_train_epochs",
        "resume_from_checkpoint",
        "trial",
    ],
    "_load_rng_state": ["self", "checkpoint"],
    # the columns `remove_unused_columns=True` keeps (TRL overrides it): the selective-rollout id column is added
    "_set_signature_columns_if_needed": ["self"],
}


def check_trl_seams(trainer_cls: type) -> None:
    """Raise ImportError when a TRL method that grpo_hub hooks into changed its signature."""
    for name, expected in TRL_SEAMS.items():
        method = getattr(trainer_cls, name, None)
        if method is None:
            raise ImportError(f"trl.GRPOTrainer.{name} is missing; grpo_hub needs {SUPPORTED_TRL}.")
        params = list(inspect.signature(method).parameters)[: len(expected)]
        if params != expected:
            raise ImportError(
                f"trl.GRPOTrainer.{name} has parameters {params}, grpo_hub expects {expected}; "
                f"install {SUPPORTED_TRL}."
            )
