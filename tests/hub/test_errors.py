"""Bad input against the local Hub: each failure is a clear HubError/ValueError and leaves the repo as it was."""

from __future__ import annotations

import pytest

from tests.hub.conftest import ALICE, BOB

pytestmark = pytest.mark.hub


@pytest.fixture
def checkpoint(trained_run):
    return trained_run["out"] / "checkpoint-2"


@pytest.fixture
def pushed(hub, checkpoint):
    """A private repo of alice's with one pushed adapter; returns its id (unique per test)."""
    from grpo_hub.hub import push_adapter

    repo_id = f"alice/errors-{len(hub.repos)}"
    push_adapter(checkpoint, repo_id, token=ALICE, private=True)
    return repo_id


def test_invalid_token_is_rejected_before_anything_is_created(hub, checkpoint):
    from grpo_hub.hub import HubAuthError, push_adapter

    with pytest.raises(HubAuthError, match=r"alice/never-made.*rejected the token.*settings/tokens"):
        push_adapter(checkpoint, "alice/never-made", token="tok-wrong")
    assert "alice/never-made" not in hub.repos


def test_missing_token_names_the_ways_to_give_one(hub, checkpoint):
    from grpo_hub.hub import HubAuthError, push_adapter

    with pytest.raises(HubAuthError, match=r"no Hub token found.*HF_TOKEN"):
        push_adapter(checkpoint, "alice/no-token")


def test_pushing_to_another_users_repo_is_forbidden_and_changes_nothing(hub, checkpoint):
    from grpo_hub.hub import HubAuthError, push_adapter

    repo_id = "alice/public-" + str(len(hub.repos))
    push_adapter(checkpoint, repo_id, token=ALICE)
    before = dict(hub.repos[repo_id].branches)
    with pytest.raises(HubAuthError, match=rf"{repo_id}@main.*403"):
        push_adapter(checkpoint, repo_id, token=BOB)
    assert hub.repos[repo_id].branches == before


def test_private_repo_is_not_found_for_other_users_and_anonymous(hub, pushed):
    from grpo_hub.hub import HubNotFoundError, download_adapter

    assert download_adapter(pushed, token=ALICE).commit_sha == hub.repos[pushed].branches["main"]
    for token in (BOB, None):
        with pytest.raises(
            HubNotFoundError, match=rf"{pushed}@main.*not found, or private.*token of a user with access"
        ):
            download_adapter(pushed, token=token)


def test_missing_repo_and_missing_revision_are_named(hub, pushed):
    from grpo_hub.hub import HubNotFoundError, download_adapter

    with pytest.raises(HubNotFoundError, match=r"alice/does-not-exist@main.*not found"):
        download_adapter("alice/does-not-exist", token=ALICE)
    with pytest.raises(HubNotFoundError, match=rf"{pushed}@step-999.*revision 'step-999' does not exist"):
        download_adapter(f"{pushed}@step-999", token=ALICE)


def test_revision_without_an_adapter_is_a_clear_error(hub, pushed):
    from huggingface_hub import HfApi

    from grpo_hub.hub import HubNotFoundError, download_adapter

    first_commit = next(c.oid for c in hub.repos[pushed].commits.values() if c.parent is None)
    HfApi(token=ALICE).create_branch(pushed, branch="empty", revision=first_commit)
    with pytest.raises(HubNotFoundError, match=rf"{pushed}@empty.*no adapter_config.json"):
        download_adapter(f"{pushed}@empty", token=ALICE)


@pytest.mark.parametrize("revision", ["main", "step-7"])
def test_connection_dropped_mid_upload_leaves_the_repo_unchanged(hub, pushed, checkpoint, revision):
    from grpo_hub.hub import HubConnectionError, push_adapter

    repo = hub.repos[pushed]
    branches, commits = dict(repo.branches), set(repo.commits)
    hub.drop_next("commit")
    with pytest.raises(
        HubConnectionError, match=rf"{pushed}@{revision}.*no answer from the Hub.*run the same command again"
    ):
        push_adapter(
            checkpoint,
            pushed,
            revision=revision,
            token=ALICE,
            record={"log_history": [{"step": 1, "reward": 9.0}]},
        )
    assert repo.branches == branches, "a half-done push changed the refs (or left its new branch behind)"
    assert set(repo.commits) == commits


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit])
def test_interrupted_push_deletes_the_branch_it_created(hub, pushed, checkpoint, monkeypatch, interruption):
    from huggingface_hub import HfApi

    from grpo_hub.hub import HubNotFoundError, download_adapter, push_adapter

    repo = hub.repos[pushed]
    branches, commits = dict(repo.branches), set(repo.commits)

    def interrupted(self, *args, **kwargs):
        assert "step-88" in repo.branches  # the branch exists at main's commit while the commit is in flight
        raise interruption()

    with monkeypatch.context() as patch, pytest.raises(interruption):
        patch.setattr(HfApi, "create_commit", interrupted)
        push_adapter(checkpoint, pushed, revision="step-88", token=ALICE)
    assert repo.branches == branches and set(repo.commits) == commits
    with pytest.raises(HubNotFoundError, match=r"revision 'step-88' does not exist"):
        download_adapter(f"{pushed}@step-88", token=ALICE)


def test_pull_of_a_branch_left_at_another_push_is_refused(hub, pushed):
    """A branch an interrupted push could not delete points at main's commit: pulling it must not load main's
    adapter under the branch's name. Tags and commit shas of that commit still pull."""
    from huggingface_hub import HfApi

    from grpo_hub.hub import HubNotFoundError, download_adapter

    api = HfApi(token=ALICE)
    api.create_branch(pushed, branch="step-88")  # what an interrupted push whose clean-up also failed leaves
    api.create_tag(pushed, tag="v1")
    with pytest.raises(
        HubNotFoundError,
        match=rf"{pushed}@step-88 .*branch 'step-88' holds no adapter pushed to it.*pushed to 'main'",
    ):
        download_adapter(f"{pushed}@step-88", token=ALICE)
    main_sha = hub.repos[pushed].branches["main"]
    assert download_adapter(f"{pushed}@v1", token=ALICE).commit_sha == main_sha
    assert download_adapter(f"{pushed}@{main_sha}", token=ALICE).commit_sha == main_sha


def _ref_only_adapter(checkpoint, folder):
    """A copy of `checkpoint`'s adapter whose weights are all named as TRL's "ref" adapter."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder.mkdir()
    shutil.copy(checkpoint / "adapter_config.json", folder)
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    renamed = {
        k.replace(".lora_A.", ".lora_A.ref.").replace(".lora_B.", ".lora_B.ref."): v
        for k, v in weights.items()
    }
    save_file(renamed, str(folder / "adapter_model.safetensors"))
    return folder


def test_bad_arguments_fail_before_any_request(hub, checkpoint, tmp_path):
    from grpo_hub.hub import parse_spec, pull_adapter, push_adapter

    sent = len(hub.requests)
    with pytest.raises(ValueError, match="invalid repo id"):
        push_adapter(checkpoint, "not a repo", token=ALICE)
    with pytest.raises(ValueError, match="pushes go to a branch"):
        push_adapter(checkpoint, "alice/x", revision="0" * 40, token=ALICE)
    with pytest.raises(ValueError, match="holds no adapter_config.json"):
        push_adapter(tmp_path, "alice/x", token=ALICE)
    with pytest.raises(ValueError, match="reference adapter"):
        push_adapter(checkpoint, "alice/x", adapter_name="ref", token=ALICE)
    with pytest.raises(ValueError, match="none named 'default'"):  # weights hold only TRL's "ref" adapter
        push_adapter(_ref_only_adapter(checkpoint, tmp_path / "ref-only"), "alice/x", token=ALICE)
    with pytest.raises(ValueError, match="invalid adapter spec"):
        parse_spec("alice/x@a@b")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("keep me")
    with pytest.raises(ValueError, match="not empty"):
        pull_adapter("alice/x", base_model=str(tmp_path), output_dir=tmp_path / "taken", token=ALICE)
    assert (tmp_path / "taken" / "file").read_text() == "keep me"
    assert len(hub.requests) == sent


def test_pushing_the_same_checkpoint_again_makes_no_new_commit(hub, pushed, checkpoint):
    from grpo_hub.hub import push_adapter

    head = hub.repos[pushed].branches["main"]
    again = push_adapter(checkpoint, pushed, token=ALICE)
    assert again.commit_sha == head and hub.repos[pushed].branches["main"] == head


def test_callback_pushes_nothing_from_non_main_processes(hub, trained_run):
    from types import SimpleNamespace

    from grpo_hub.hub import HubPushCallback

    callback = HubPushCallback("alice/not-rank-zero", token=ALICE)
    state = SimpleNamespace(is_world_process_zero=False, global_step=2, log_history=[])
    args = SimpleNamespace(output_dir=str(trained_run["out"]))
    sent = len(hub.requests)
    callback.on_train_begin(args, state, None)
    callback.on_save(args, state, None)
    callback.on_train_end(args, state, None, model=trained_run["trainer"].model)
    assert callback.pushed == [] and len(hub.requests) == sent


def test_unreachable_hub_is_a_connection_error_naming_the_endpoint(hub, monkeypatch):
    from huggingface_hub import constants

    from grpo_hub.hub import HubConnectionError, download_adapter
    from tests.conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # a port that was free a moment ago: nothing listens there
    monkeypatch.setattr(constants, "ENDPOINT", dead)
    with pytest.raises(
        HubConnectionError,
        match=rf"pull alice/anything@main: no answer from the Hub at {dead}: connection refused",
    ):
        download_adapter("alice/anything", token=ALICE)
