"""Pull an adapter from the Hub: `owner/name@revision` -> PeftModel on its base model, or a merged model.

The revision (branch, tag or commit) is resolved to its commit sha first and everything is downloaded at
that sha, so what is returned and logged is pinned. Downloads go through the Hugging Face cache (files
land complete or not at all); a merged or saved model folder is written to a temporary sibling and renamed
into place.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from grpo_hub.hub.adapter_files import ADAPTER_CONFIG, ADAPTER_WEIGHTS, TOKENIZER_FILES
from grpo_hub.hub.errors import HubError, HubNotFoundError, hub_errors
from grpo_hub.hub.push import COMMIT_SHA, check_repo_id
from grpo_hub.records.model_card import REWARD_CURVE, pushed_revision
from grpo_hub.records.run_record import RUN_RECORD

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PullInfo:
    """Where a pulled adapter came from (pinned `commit_sha`) and where it is on disk."""

    repo_id: str
    revision: str
    commit_sha: str
    adapter_dir: str
    base_model: str | None
    output_dir: str | None = None

    def __fspath__(self) -> str:
        return self.adapter_dir


def parse_spec(spec: str) -> tuple[str, str]:
    """'owner/name[@revision]' -> (repo_id, revision); the revision defaults to 'main'."""
    if not isinstance(spec, str) or spec.count("@") > 1:
        raise ValueError(f"invalid adapter spec {spec!r}. Fix: use 'owner/name' or 'owner/name@revision'.")
    repo_id, sep, revision = spec.partition("@")
    check_repo_id(repo_id)
    if sep and not revision:
        raise ValueError(f"adapter spec {spec!r} has an empty revision after '@'. Fix: 'owner/name@main'.")
    return repo_id, revision or "main"


def download_adapter(spec: str, *, token: str | None = None) -> PullInfo:
    """Download the adapter files of `spec` at its resolved commit into the HF cache (no model loading)."""
    from huggingface_hub import HfApi, snapshot_download

    repo_id, revision = parse_spec(spec)
    patterns = [ADAPTER_CONFIG, ADAPTER_WEIGHTS, "README.md", REWARD_CURVE, RUN_RECORD, *TOKENIZER_FILES]
    with hub_errors("pull", repo_id, revision):
        sha = HfApi(token=token).model_info(repo_id, revision=revision).sha
        local = snapshot_download(repo_id, revision=sha, allow_patterns=patterns, token=token)
    folder = Path(local)
    if not (folder / ADAPTER_CONFIG).is_file() or not (folder / ADAPTER_WEIGHTS).is_file():
        raise HubNotFoundError(
            f"pull {repo_id}@{revision} (commit {sha}): no {ADAPTER_CONFIG} + {ADAPTER_WEIGHTS} at this revision. "
            "Fix: pick a revision that holds a pushed adapter (see the repo's branches, e.g. 'main' or 'step-<N>')."
        )
    _check_branch_holds_its_push(repo_id, revision, sha, folder, token)
    base = json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    logger.info("pulled %s@%s pinned to commit %s", repo_id, revision, sha)
    return PullInfo(repo_id, revision, sha, str(folder), base)


def _check_branch_holds_its_push(
    repo_id: str, revision: str, sha: str, folder: Path, token: str | None
) -> None:
    """Raise when branch `revision` carries an adapter pushed to another branch (a push that never landed)."""
    from huggingface_hub import HfApi

    card = folder / "README.md"
    pushed = pushed_revision(card.read_text(encoding="utf-8")) if card.is_file() else None
    if pushed is None or pushed == revision or COMMIT_SHA.match(revision):
        return
    with hub_errors("pull", repo_id, revision):
        branches = {ref.name for ref in HfApi(token=token).list_repo_refs(repo_id).branches}
    if revision in branches:  # tags may point anywhere: only a branch is meant to hold its own push
        raise HubNotFoundError(
            f"pull {repo_id}@{revision} (commit {sha}): branch {revision!r} holds no adapter pushed to it; its head "
            f"is the adapter pushed to {pushed!r} (a push to {revision!r} was interrupted after creating the branch). "
            f"Fix: push to {revision!r} again, or pull {repo_id}@{pushed}."
        )


def check_output_dir(output_dir: str | os.PathLike) -> Path:
    """`output_dir` as a Path; ValueError if it exists and is not an empty folder (nothing is overwritten)."""
    target = Path(output_dir)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ValueError(
            f"output folder {target} already exists and is not empty. Fix: pass a new or empty folder."
        )
    return target


def write_folder_atomically(output_dir: str | os.PathLike, write) -> str:
    """Call `write(tmp_folder)`, then rename the folder to `output_dir`; nothing is left behind on failure."""
    target = check_output_dir(output_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        write(staging)
        if target.exists():
            target.rmdir()
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def pull_adapter(
    spec: str,
    *,
    base_model: str | None = None,
    merge: bool = False,
    output_dir: str | os.PathLike | None = None,
    token: str | None = None,
    dtype=None,
):
    """Load `spec` ('owner/name@revision') as a PeftModel on its base model; returns (model, PullInfo).

    `base_model` (a Hub id or local folder) overrides the adapter config's `base_model_name_or_path`.
    `merge=True` returns the merged plain model. `output_dir` saves the result (merged model, or the
    adapter) with its tokenizer there, atomically.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if output_dir is not None:
        check_output_dir(output_dir)
    info = download_adapter(spec, token=token)
    base = base_model or info.base_model
    if not base:
        raise ValueError(
            f"pull {spec}: adapter_config.json names no base model. Fix: pass base_model= (--base-model) a Hub id or folder."
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, token=token)
    except OSError as err:
        raise HubError(
            f"pull {spec}: base model {base!r} could not be loaded ({err}). "
            "Fix: pass base_model= (--base-model) a local folder or a Hub id you can read."
        ) from err
    model = PeftModel.from_pretrained(model, info.adapter_dir)
    if merge:
        model = model.merge_and_unload()
    info = replace(info, base_model=base)
    if output_dir is not None:
        has_tokenizer = (Path(info.adapter_dir) / "tokenizer_config.json").is_file()
        tokenizer = AutoTokenizer.from_pretrained(info.adapter_dir if has_tokenizer else base, token=token)

        def write(folder: str) -> None:
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)

        info = replace(info, output_dir=write_folder_atomically(output_dir, write))
        logger.info(
            "wrote %s model from %s@%s to %s",
            "merged" if merge else "adapter",
            info.repo_id,
            info.commit_sha,
            info.output_dir,
        )
    return model, info
