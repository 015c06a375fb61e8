"""The worker extension a vLLM server loads (`--worker-extension-cls grpo_hub.generation.worker_extension.WorkerExtension`)
so that `vllm_server_sync='merged'` can reload the trainer's weights in place over HTTP, without NCCL, from files inside
the server's sync folder only (`server_auth.SYNC_DIR_ENV`, fixed when it starts).

vLLM mixes this class into its worker; `POST /collective_rpc {"method": ..., "args": [...]}` (enabled by
`VLLM_SERVER_DEV_MODE=1`) calls a method on every worker. vLLM's own RL weight API (`/update_weights`) has only CUDA
backends in 0.32; `model_runner.reload_weights` works on every platform, and on vLLM's CPU backend re-packs the oneDNN
weights (a plain `model.load_weights` fails on them). Imported by the server, never by the trainer.
"""

from __future__ import annotations

import os

from grpo_hub.generation.colocate import repack_embeddings
from grpo_hub.generation.server_auth import SYNC_DIR_ENV, inside_sync_folder

VERSION = 2  # bumped when a method's arguments change (2: weights only from the sync folder)


class WorkerExtension:
    """Methods vLLM adds to its worker (`self.model_runner` is the worker's)."""

    def grpo_hub_extension_version(self) -> int:
        """What the trainer asks before training: the extension is loaded, and which version."""
        return VERSION

    def grpo_hub_sync_dir(self) -> str | None:
        """The sync folder fixed when the server started (SYNC_DIR_ENV), resolved; None without one."""
        folder = os.environ.get(SYNC_DIR_ENV)
        return str(os.path.realpath(folder)) if folder else None

    def grpo_hub_reload_weights(self, path: str) -> int:
        """Reload every weight from the safetensors file at `path` (checkpoint names), in place; returns the count.
        Only a file inside the sync folder loads (`inside_sync_folder`): any other path is refused."""
        from safetensors.torch import load_file

        tensors = load_file(str(inside_sync_folder(path, os.environ.get(SYNC_DIR_ENV))))
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        repack_embeddings(self.model_runner.model)
        return len(tensors)

    def grpo_hub_reload_checkpoint(self) -> None:
        """Reload the checkpoint the server started from (undoes earlier merged syncs: the base of 'adapter')."""
        self.model_runner.reload_weights(is_checkpoint_format=True)
        repack_embeddings(self.model_runner.model)
