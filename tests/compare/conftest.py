"""Fixtures of the Space tests: adapters made on the offline tiny base (`tiny_model_dir`, tests/conftest.py),
trained, random and zero; `wait_until_served` for the tests that start the Space."""

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

STARTUP_S = 180


def wait_until_served(url: str, process: subprocess.Popen, log: Path) -> None:
    """Poll `url` until it answers; fail with the server log if the process exits or never answers."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the Space exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the Space did not answer within {STARTUP_S} s:\n{log.read_text()[-3000:]}")


def _save_lora(base: str, folder, init_lora_weights) -> str:
    """Save a rank-8 LoRA on q/v projections of `base`; `init_lora_weights=False` makes it non-zero."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(base)
    config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=init_lora_weights)
    get_peft_model(model, config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def random_adapter(tiny_model_dir, tmp_path_factory):
    """An adapter with random, non-zero LoRA A and B on the tiny base."""
    return _save_lora(tiny_model_dir, tmp_path_factory.mktemp("random") / "adapter", init_lora_weights=False)


@pytest.fixture(scope="session")
def zero_adapter(tiny_model_dir, tmp_path_factory):
    """A freshly initialised adapter (LoRA B = 0): the model it makes equals the base."""
    return _save_lora(tiny_model_dir, tmp_path_factory.mktemp("zero") / "adapter", init_lora_weights=True)


@pytest.fixture(scope="session")
def foreign_adapter(random_adapter, tmp_path_factory):
    """The random adapter, relabelled as trained on another base model."""
    folder = tmp_path_factory.mktemp("foreign") / "adapter"
    shutil.copytree(random_adapter, folder)
    config_path = folder / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = "someone/another-model"
    config_path.write_text(json.dumps(config))
    return str(folder)


@pytest.fixture(scope="session")
def trained_adapter(tiny_model_dir, tmp_path_factory):
    """A LoRA adapter trained for a few GRPO steps with plain trl.GRPOTrainer on the digits task (the tiny
    random model's smoke task: graded reward, so its groups have signal)."""
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from grpo_hub.tasks import get_reward_funcs, load_task_dataset

    out = tmp_path_factory.mktemp("trained")
    args = GRPOConfig(
        output_dir=str(out / "run"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=4,
        learning_rate=5e-2,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=get_reward_funcs("digits"),
        args=args,
        train_dataset=load_task_dataset("digits", n=16, seed=0),
        peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
    )
    trainer.train()
    trainer.save_model(str(out / "adapter"))
    return str(out / "adapter")
