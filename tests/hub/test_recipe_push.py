"""`recipes/grpo.py --push_to_hub` under DeepSpeed ZeRO-3 on 2 CPU ranks: adapter-only pushes, full tensors."""

import pytest
import torch
from safetensors.torch import load, load_file

from tests.conftest import requires
from tests.hub.conftest import ALICE
from tests.recipes.helpers import SMALL_EVAL, launch
from tests.training.distributed.launch import partitioned_zero3_config

REPO = "alice/zero3-recipe-lora"


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.deepspeed
def test_recipe_pushes_gathered_zero3_adapter_per_checkpoint_and_final(hub, tmp_path):
    requires("deepspeed", "ZeRO-3 recipe push")
    summary, out = launch(
        tmp_path,
        "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "1",
        "--push_to_hub", "true", "--hub_model_id", REPO, "--hub_token", ALICE,
        "--use_cpu", "true", "--bf16", "false", *SMALL_EVAL,
        accelerate_config=partitioned_zero3_config(tmp_path),
        env={"HF_HUB_OFFLINE": "0"},
    )  # fmt: skip
    assert summary["world_size"] == 2 and summary["steps"] == 2
    local = load_file(str(out / "adapter_model.safetensors"))  # save_model gathers ZeRO-3 shards
    for revision in ("step-1", "step-2", "main"):
        files = hub.files(REPO, revision)
        assert {"adapter_model.safetensors", "adapter_config.json", "README.md"} <= set(files)
        assert not any(
            name.startswith(("ref/", "optimizer", "training_args", "global_step")) for name in files
        )
    pushed = load(hub.files(REPO, "main")["adapter_model.safetensors"])
    assert pushed.keys() == local.keys() and all(t.numel() > 0 for t in pushed.values())
    for name, tensor in local.items():
        torch.testing.assert_close(pushed[name], tensor, rtol=0, atol=0)
    assert any(t.abs().sum() > 0 for n, t in pushed.items() if "lora_B" in n)  # trained, not the zero init
    assert hub.files(REPO, "main")["README.md"].startswith(b"---")  # the model card's YAML front matter
