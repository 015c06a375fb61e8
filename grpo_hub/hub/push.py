"""Push a trained LoRA adapter, its tokenizer, a model card and a reward curve to the Hub as ONE commit.

The revision is a branch (`main`, or e.g. `step-200` for a checkpoint, created from `main` if missing).
Everything goes through `HfApi.create_commit` with all operations at once, so a failure leaves the repo as
it was; a branch created for a push that then fails or is interrupted (Ctrl-C) is deleted again, and a pull of a
branch that still points at another branch's push is refused (`pull.py`). Never pushed: the reference
adapter, optimizer/scheduler/rng state, trainer_state.json, training_args.bin (it can hold a token).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from grpo_hub.hub.adapter_files import ADAPTER_CONFIG, trained_adapter_files
from grpo_hub.hub.errors import hub_errors
from grpo_hub.records.model_card import REWARD_CURVE, build_model_card, hub_model_id, reward_curve_png
from grpo_hub.records.run_record import RUN_RECORD, read_run_record

logger = logging.getLogger(__name__)
REPO_ID = re.compile(r"^([\w.-]+/)?[\w.-]+$")
BRANCH = re.compile(r"^(?!refs/)(?!.*\.\.)[\w.-]+(/[\w.-]+)*$")
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class PushResult:
    """What a push created: the repo, the branch, and the commit it is pinned to."""

    repo_id: str
    revision: str
    commit_sha: str
    commit_url: str
    files: tuple[str, ...]


def check_repo_id(repo_id: str) -> None:
    """Raise ValueError unless `repo_id` is 'owner/name' (or a bare name for the token's own namespace)."""
    if not isinstance(repo_id, str) or not REPO_ID.match(repo_id) or repo_id.startswith(("/", ".")):
        raise ValueError(f"invalid repo id {repo_id!r}. Fix: use 'owner/name', e.g. 'alice/qwen-grpo-lora'.")


def check_branch(revision: str) -> None:
    """Raise ValueError unless `revision` can name a branch (pushes never target a tag or a commit sha)."""
    if not isinstance(revision, str) or COMMIT_SHA.match(revision) or not BRANCH.match(revision):
        raise ValueError(
            f"cannot push to revision {revision!r}: pushes go to a branch. Fix: use 'main' or a name like 'step-200'."
        )


def create_adapter_repo(repo_id: str, *, token: str | None = None, private: bool | None = None) -> str:
    """Check the token, create the model repo if needed and return its full id ('owner/name')."""
    from huggingface_hub import HfApi

    check_repo_id(repo_id)
    api = HfApi(token=token)
    with hub_errors("push to", repo_id):
        api.whoami()
        return api.create_repo(repo_id, private=private, exist_ok=True).repo_id


def _branch_to_create(api, repo_id: str, branch: str) -> bool:
    """True when `branch` is missing (this push creates it from main); a tag of that name is an error."""
    if branch == "main":
        return False
    refs = api.list_repo_refs(repo_id)
    if branch in {ref.name for ref in refs.branches}:
        return False
    if branch in {ref.name for ref in refs.tags}:
        raise ValueError(
            f"{branch!r} is a tag of {repo_id}; pushes go to branches. Fix: pick another revision name."
        )
    return True


def push_adapter(
    folder: str | Path,
    repo_id: str,
    *,
    revision: str = "main",
    base_model: str | None = None,
    record: dict | None = None,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    adapter_name: str = "default",
) -> PushResult:
    """Push the trained adapter in `folder` (trainer output_dir or checkpoint-<N>) to `repo_id@revision`.

    `record` (a run record, `grpo_hub.records.run_record`) defaults to the one saved with the folder
    (grpo_run.json, else trainer_state.json, else run_summary.json); the card, reward curve and record are
    built from it. `base_model` overrides the adapter config's `base_model_name_or_path`. Returns the
    commit the revision now points to.
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    check_repo_id(repo_id)
    check_branch(revision)
    root = Path(folder)
    files = trained_adapter_files(root, adapter_name=adapter_name, base_model=base_model)
    config_source = files[ADAPTER_CONFIG]
    adapter_config = json.loads(
        config_source if isinstance(config_source, bytes) else config_source.read_text()
    )
    record = read_run_record(root) if record is None else record
    base = base_model or adapter_config.get("base_model_name_or_path")
    record = {**record, "base_model": base}
    if base and hub_model_id(base) is None:
        logger.warning(
            "the base model %s is a local path: the pushed adapter loads only where that folder exists. "
            "Fix: push with --base-model OWNER/NAME (base_model=) naming its Hub id.",
            base,
        )
    step = record.get("step")
    curve = reward_curve_png(record.get("log_history", []))
    if curve is not None:
        files[REWARD_CURVE] = curve
    files[RUN_RECORD] = (json.dumps(record, indent=2) + "\n").encode()

    full_id = create_adapter_repo(repo_id, token=token, private=private)  # after all local input is read
    card = build_model_card(
        record, adapter_config=adapter_config, repo_id=full_id, revision=revision, has_curve=curve is not None
    )
    files["README.md"] = str(card).encode()
    operations = [
        CommitOperationAdd(
            path_in_repo=name, path_or_fileobj=content if isinstance(content, bytes) else str(content)
        )
        for name, content in sorted(files.items())
    ]
    message = commit_message or (
        f"Upload GRPO adapter (step {step})" if step is not None else "Upload GRPO adapter"
    )
    api = HfApi(token=token)
    with hub_errors("push to", full_id, revision):
        creates_branch = _branch_to_create(api, full_id, revision)
        try:
            if creates_branch:
                api.create_branch(full_id, branch=revision)
            info = api.create_commit(full_id, operations, commit_message=message, revision=revision)
        except BaseException:  # Ctrl-C too: a new branch left at main's commit would serve main's adapter
            if creates_branch:
                _delete_branch_quietly(api, full_id, revision)
            raise
    logger.info("pushed adapter from %s to %s@%s (commit %s)", root, full_id, revision, info.oid)
    return PushResult(full_id, revision, info.oid, info.commit_url, tuple(sorted(files)))


def _delete_branch_quietly(api, repo_id: str, branch: str) -> None:
    """Undo a branch this push created; when that fails too, say so (the caller re-raises the push error)."""
    from huggingface_hub.errors import RevisionNotFoundError

    try:
        api.delete_branch(repo_id, branch=branch)
    except RevisionNotFoundError:  # interrupted before the branch was made
        pass
    except Exception as err:  # the push error is the one to report; this is a note on what was left
        logger.warning(
            "push to %s@%s failed and the new branch could not be deleted (a pull of it is refused): %s",
            repo_id,
            branch,
            err,
        )
