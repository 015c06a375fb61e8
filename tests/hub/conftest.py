"""Hub test fixtures: the local Hub server, a client pointed at it, and one tiny GRPO + LoRA run pushed live.

`huggingface_hub` reads HF_ENDPOINT, the cache paths and HF_HUB_DISABLE_XET into `constants` at import, so
`point_client_at` sets both the environment (for subprocesses) and those constants (for this process).
The product code only ever sees an ordinary Hub endpoint.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hub.fake_hub import FakeHub

ALICE, BOB = "tok-alice-0123456789", "tok-bob-0123456789"
TOKENS = {ALICE: "alice", BOB: "bob"}
RUN_REPO = "alice/tiny-grpo-lora"
RUN_BASE_MODEL_ID = "alice/tiny-qwen2"  # what the card names as base; pulls override it with the local folder


def point_client_at(mp: pytest.MonkeyPatch, url: str, home: Path) -> None:
    """Send every huggingface_hub call in this process (and in subprocesses) to `url`, with cache under `home`."""
    from huggingface_hub import constants, hf_api

    env = {
        "HF_ENDPOINT": url,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    for name, value in env.items():
        mp.setenv(name, value)
    mp.delenv("HF_TOKEN", raising=False)
    mp.setattr(constants, "ENDPOINT", url)
    mp.setattr(hf_api.api, "endpoint", url)  # the module-level client behind huggingface_hub.file_exists & co
    mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    mp.setattr(constants, "HF_HUB_DISABLE_XET", True)
    mp.setattr(constants, "HF_HUB_OFFLINE", False)
    mp.setattr(constants, "HF_HOME", str(home))
    mp.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    mp.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    mp.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))


@pytest.fixture(scope="session")
def fake_hub():
    with FakeHub(TOKENS) as hub:
        yield hub


@pytest.fixture
def hub(fake_hub, tmp_path, monkeypatch):
    """The running server, with this test's client (and fresh HF cache) pointed at it."""
    point_client_at(monkeypatch, fake_hub.url, tmp_path / "hf_home")
    return fake_hub


@pytest.fixture(scope="session")
def trained_run(fake_hub, tiny_model_dir, tmp_path_factory):
    """Train 4 GRPO steps (LoRA, beta > 0 so TRL adds a "ref" adapter), checkpoints at 2 and 4, with
    HubPushCallback pushing live to the local Hub. Returns the output folder, the callback and the trainer."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from grpo_hub.hub import HubPushCallback
    from grpo_hub.tasks import SMOKE_TASK, get_reward_funcs, load_task_dataset

    out = tmp_path_factory.mktemp("run") / "out"
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), lora)
    args = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="steps",
        save_steps=2,
        max_steps=4,
        logging_steps=1,
        seed=0,
        disable_tqdm=True,
        num_generations=4,
        per_device_train_batch_size=4,
        max_completion_length=8,
        beta=0.04,
        learning_rate=3e-2,
        hub_token=ALICE,  # must never reach the Hub in any pushed file
    )
    callback = HubPushCallback(RUN_REPO, base_model=RUN_BASE_MODEL_ID, token=ALICE)
    trainer = GRPOTrainer(
        model=model,
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        reward_funcs=get_reward_funcs(SMOKE_TASK),
        args=args,
        train_dataset=load_task_dataset(SMOKE_TASK, n=16, seed=0),
        callbacks=[callback],
    )
    assert set(trainer.model.peft_config) == {"default", "ref"}, "TRL did not add its reference adapter"
    with pytest.MonkeyPatch.context() as mp:
        point_client_at(mp, fake_hub.url, tmp_path_factory.mktemp("hf_home_run"))
        trainer.train()
    trainer.save_model(str(out))
    return {"out": out, "callback": callback, "trainer": trainer}
