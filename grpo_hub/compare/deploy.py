"""Deploy the comparison Space to the Hub: `deploy_space("owner/name", adapters=..., base_model=...)`.

One commit to a Gradio Space repo (created if missing) holds `app.py` and the Space card (`README.md`,
front matter validated by the Hub) from `spaces_app/`, the `grpo_hub` package itself, source and package data
such as the shipped chain model (the Space imports it from its own folder: `grpo-hub` is on no package
registry, and builds or finds the offline base models there) and a `requirements.txt` listing
grpo_hub's runtime dependencies from its package metadata. Files of an earlier deploy that are gone from the
package are deleted in the same commit. The models are Space variables (`SPACE_VARIABLES`), read by
`grpo_hub.compare.space.default_config`; `public=True` locks the model fields of the UI to them.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

from grpo_hub.compare.bank import parse_adapter_specs
from grpo_hub.hub.errors import hub_errors
from grpo_hub.hub.push import check_repo_id

BASE_VARIABLE, ADAPTERS_VARIABLE, PUBLIC_VARIABLE = (
    "GRPO_HUB_BASE_MODEL",
    "GRPO_HUB_ADAPTERS",
    "GRPO_HUB_PUBLIC",
)
PACKAGE = Path(__file__).resolve().parents[1]  # the grpo_hub package folder
SPACE_APP = PACKAGE.parent / "spaces_app"
SPACE_FILES = ("app.py", "README.md")
# Extras a Space needs on top of the core dependencies (gradio itself comes with the Space's sdk image,
# listing it keeps a local `pip install -r requirements.txt` complete).
SPACE_EXTRAS = ("space",)


@dataclass(frozen=True)
class DeployResult:
    """The deployed Space: its id, URL, the commit of its files and the variables it was given."""

    space_id: str
    url: str
    commit_sha: str
    variables: dict[str, str]


def space_requirements() -> str:
    """requirements.txt of the Space: grpo-hub's core dependencies and those of the `space` extra."""
    lines = []
    for requirement in importlib.metadata.requires("grpo-hub") or []:
        spec, _, marker = requirement.partition(";")
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if extra is None or extra.group(1) in SPACE_EXTRAS:
            lines.append(spec.strip())
    return "\n".join(dict.fromkeys(lines)) + "\n"


def _is_packaged(relative: Path) -> bool:
    """Whether a path inside the package folder belongs to the package: not in a cache, not hidden."""
    return not any(part == "__pycache__" or part.startswith(".") for part in relative.parts)


def package_files() -> dict[str, Path]:
    """Repo path -> file for every file of the grpo_hub package: its modules and its package data (the shipped
    chain model in `tasks/data/chain-model/`, which the Space loads as base "chain")."""
    return {
        f"grpo_hub/{path.relative_to(PACKAGE).as_posix()}": path
        for path in sorted(PACKAGE.rglob("*"))
        if path.is_file() and _is_packaged(path.relative_to(PACKAGE))
    }


def space_files() -> dict[str, bytes | Path]:
    """Everything the Space repo holds: app, card, requirements and the package (source and data)."""
    missing = [name for name in SPACE_FILES if not (SPACE_APP / name).is_file()]
    if missing:
        raise ValueError(
            f"{SPACE_APP} lacks {missing}: deploy needs grpo_hub's source tree. "
            "Fix: run from a clone (pip install -e .)."
        )
    files: dict[str, bytes | Path] = {name: SPACE_APP / name for name in SPACE_FILES}
    files["requirements.txt"] = space_requirements().encode()
    return files | package_files()


def space_variables(base_model: str | None, adapters: str, public: bool) -> dict[str, str]:
    """The Space variables for these models (checked: at least one adapter, at most four, no local paths)."""
    specs = parse_adapter_specs(adapters)
    if not specs:
        raise ValueError(
            "--adapters is empty. Fix: name the pushed adapters, e.g. --adapters alice/chain-grpo@main."
        )
    names = [s for s in (*specs, base_model) if s]
    local = [s for s in names if s.startswith(("/", "./", "../", "~")) or Path(s).exists()]
    if local:
        raise ValueError(
            f"{local} are local paths, which a Space cannot read. Fix: push them first "
            "(grpo-hub push FOLDER OWNER/NAME) and pass their Hub ids."
        )
    variables = {ADAPTERS_VARIABLE: ", ".join(specs), PUBLIC_VARIABLE: "1" if public else "0"}
    if base_model:
        variables[BASE_VARIABLE] = base_model
    return variables


def deploy_space(
    space_id: str,
    *,
    adapters: str,
    base_model: str | None = None,
    public: bool = True,
    private: bool | None = None,
    token: str | None = None,
) -> DeployResult:
    """Create or update the Gradio Space `space_id` in one commit and set its variables; returns its URL.

    `base_model` unset: the Space loads grpo_hub's offline chain model, the recipe's default base (shipped in
    the uploaded package); "arithmetic" and "tiny" name the other offline models (built on the Space, see
    `grpo_hub.tasks.OFFLINE_MODELS`).
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    check_repo_id(space_id)
    variables = space_variables(base_model, adapters, public)
    files = space_files()
    api = HfApi(token=token)
    with hub_errors("deploy Space", space_id):
        api.whoami()
        repo = api.create_repo(
            space_id, repo_type="space", space_sdk="gradio", private=private, exist_ok=True
        )
        full_id = repo.repo_id
        stale = [
            path
            for path in api.list_repo_files(full_id, repo_type="space")
            if path.startswith("grpo_hub/") and path not in files
        ]
        operations = [
            CommitOperationAdd(
                path_in_repo=name, path_or_fileobj=content if isinstance(content, bytes) else str(content)
            )
            for name, content in sorted(files.items())
        ] + [CommitOperationDelete(path_in_repo=path) for path in stale]
        commit = api.create_commit(
            full_id, operations, repo_type="space", commit_message="Deploy the grpo_hub comparison Space"
        )
        for name, value in variables.items():
            api.add_space_variable(full_id, name, value)
        if BASE_VARIABLE not in variables:
            api.delete_space_variable(full_id, BASE_VARIABLE)
    return DeployResult(full_id, repo.url, commit.oid, variables)
