"""Hub workflow for trained LoRA adapters: the public API in one place.

- `push_adapter(folder, repo_id, revision=...)`: one commit with the trained adapter (never the "ref"
  adapter or optimizer state), tokenizer, model card and reward curve (`push`).
- `HubPushCallback(repo_id)`: checkpoint-N -> branch `step-N`, final adapter -> `main` (`callback`).
- `pull_adapter("owner/name@rev")` -> (PeftModel or merged model, PullInfo with the pinned commit sha);
  `download_adapter` fetches the files only (`pull`).
- Every client failure surfaces as a `HubError` naming the repo/revision and the fix (`errors`).
"""

from grpo_hub.hub.callback import HubPushCallback
from grpo_hub.hub.errors import HubAuthError, HubConnectionError, HubError, HubNotFoundError
from grpo_hub.hub.pull import PullInfo, download_adapter, parse_spec, pull_adapter
from grpo_hub.hub.push import PushResult, create_adapter_repo, push_adapter

__all__ = [
    "HubAuthError",
    "HubConnectionError",
    "HubError",
    "HubNotFoundError",
    "HubPushCallback",
    "PullInfo",
    "PushResult",
    "create_adapter_repo",
    "download_adapter",
    "parse_spec",
    "pull_adapter",
    "push_adapter",
]
