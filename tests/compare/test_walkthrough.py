"""The README walkthrough end to end against the local Hub: train (recipe) -> `grpo-hub push` ->
`grpo-hub space deploy` -> the deployed Space's files, served by `python app.py`, run the comparison.
The recipe trains the default task (chain) on its shipped model, which the Space loads from its own copy."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest

from grpo_hub.tasks import chain
from grpo_hub.tasks.arithmetic import chat_text
from tests.compare.conftest import wait_until_served
from tests.conftest import RUN_LIMIT_S, free_port, requires
from tests.hub.conftest import ALICE, TOKENS, point_client_at
from tests.hub.fake_hub import FakeHub, validate_card_yaml
from tests.recipes.helpers import launch, preset

pytestmark = pytest.mark.hub
PROMPT = chat_text(chain.heldout_problems()[-1].question)  # a level-4 held-out problem, as the model reads it
SHIPPED = "grpo_hub/tasks/data/chain-model"


def _grpo_hub(capsys, *argv) -> str:
    from grpo_hub.cli import main

    assert main([*argv, "--token", ALICE]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_train_push_deploy_compare(tmp_path, monkeypatch, capsys):
    requires("gradio", "the Space")
    from gradio_client import Client
    from huggingface_hub import HfApi, ModelCard, SpaceCard, snapshot_download

    with FakeHub(TOKENS) as hub:
        point_client_at(monkeypatch, hub.url, tmp_path / "hf_home")
        live = ("--push_to_hub", "true", "--hub_model_id", "alice/chain-grpo-live", "--hub_token", ALICE)
        summary, out = launch(tmp_path, "--max_steps", "4", *live, env={"HF_HUB_OFFLINE": "0"})
        console = (tmp_path / "console.log").read_text()
        live_sha = hub.repos["alice/chain-grpo-live"].branches["main"]
        assert summary["pushed"] == {
            "repo_id": "alice/chain-grpo-live",
            "revision": "main",
            "commit_sha": live_sha,
        }
        assert f"pushed to the Hub: alice/chain-grpo-live@main (commit {live_sha[:7]})" in console
        assert "step 4/4  reward " in console and "'completions/mean_length'" not in console  # compact lines
        assert "FutureWarning" not in console
        assert set(hub.repos["alice/chain-grpo-live"].branches) == {
            "main"
        }  # save_strategy "no": no step branch

        pushed = _grpo_hub(capsys, "push", str(out), "alice/chain-grpo", "--revision", "main")
        sha = hub.repos["alice/chain-grpo"].branches["main"]
        assert f"to alice/chain-grpo@main (commit {sha[:7]})" in pushed
        files = hub.files("alice/chain-grpo")
        card = ModelCard(files["README.md"].decode())
        assert "reward_curve.png" in files and "No metrics were logged" not in card.text
        assert (
            "loss variant **`dapo`**, 4 training steps" in card.text
            and f"| `learning_rate` | {preset('chain.yaml')['learning_rate']:.4g} |" in card.text
        )
        assert "--base-model OWNER/BASE" in card.text  # the recipe's base is a local folder: the card says so

        deployed = _grpo_hub(
            capsys,
            "space",
            "deploy",
            "alice/chain-grpo-space",
            "--base-model",
            "chain",
            "--adapters",
            "alice/chain-grpo@main",
        )
        assert f"open it at {hub.url}/spaces/alice/chain-grpo-space" in deployed
        space = hub.files("alice/chain-grpo-space", repo_type="space")
        assert validate_card_yaml(space["README.md"].decode(), "space") == []
        assert SpaceCard(space["README.md"].decode()).data.sdk == "gradio"
        assert {
            "app.py",
            "requirements.txt",
            "grpo_hub/compare/space.py",
            f"{SHIPPED}/model.safetensors",
        } <= set(space)
        variables = {
            k: v.value for k, v in HfApi(token=ALICE).get_space_variables("alice/chain-grpo-space").items()
        }
        assert variables == {
            "GRPO_HUB_ADAPTERS": "alice/chain-grpo@main",
            "GRPO_HUB_BASE_MODEL": "chain",  # an offline model by name: shipped in the Space's grpo_hub
            "GRPO_HUB_PUBLIC": "1",
        }

        folder = snapshot_download("alice/chain-grpo-space", repo_type="space", local_dir=tmp_path / "space")
        port = free_port()
        env = {
            k: v for k, v in os.environ.items() if k != "PYTHONPATH"
        } | variables  # grpo_hub from the Space
        env |= {"GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1"}
        log = tmp_path / "space.log"
        with log.open("w") as sink:
            process = subprocess.Popen(
                [sys.executable, "app.py"], cwd=folder, env=env, stdout=sink, stderr=subprocess.STDOUT
            )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_served(url, process, log)
            urllib.request.urlopen(url, timeout=10).close()
            client = Client(url, verbose=False)
            # public mode: the model fields sent here are ignored in favour of the Space variables
            # temperature, top_p, max_new_tokens, seed, n, rewards, show_diff
            controls = (1.0, 1.0, 48, 0, 2, ["chain_correctness_reward"], False)
            result = client.predict("/etc/passwd", "someone/else", PROMPT, *controls, api_name="/compare")
        finally:
            process.terminate()
            process.wait(timeout=RUN_LIMIT_S)
    assert [update["visible"] for update in result[:5]] == [True, True, False, False, False]
    adapter_column = result[1]["value"]
    assert "<h3>alice/chain-grpo@main</h3>" in adapter_column and f">{sha[:7]}</a>" in adapter_column
    assert 'step <span class="step">4</span>' in adapter_column and ">dapo<" in adapter_column
    assert adapter_column.count('class="sample"') == 2
    assert adapter_column.count('data-name="chain_correctness_reward"') == 3  # the mean and both samples
    served = log.read_text()
    assert f"base model: {folder}/{SHIPPED}\n" in served  # the chain model uploaded with the Space's grpo_hub
    assert "(model fields locked)" in served
