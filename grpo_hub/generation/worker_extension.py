"""The worker extension a vLLM server loads (`--worker-extension-cls grpo_hub.generation.worker_extension.WorkerExtension`)
so that `vllm_server_sync='merged'` can reload the trainer's weights in place over HTTP, without NCCL.

vLLM mixes this class into its worker; `POST /collective_rpc {"method": ..., "args": [...]}` (enabled by
`VLLM_SERVER_DEV_MODE=1`) calls a method on every worker. vLLM's own RL weight API (`/update_weights`) has only CUDA
backends in 0.32; `model_runner.reload_weights` works on every platform, and on vLLM's CPU backend re-packs the oneDNN
weights (a plain `model.load_weights` fails on them). Imported by the server, never by the trainer.
"""

from __future__ import annotations

from grpo_hub.generation.colocate import repack_embeddings

VERSION = 1  # bumped when a method's arguments change


class WorkerExtension:
    """Methods vLLM adds to its worker (`self.model_runner` is the worker's)."""

    def grpo_hub_extension_version(self) -> int:
        """What the trainer asks before training: the extension is loaded, and which version."""
        return VERSION

    def grpo_hub_reload_weights(self, path: str) -> int:
        """Reload every weight from the safetensors file at `path` (checkpoint names), in place; returns the count."""
        from safetensors.torch import load_file

        tensors = load_file(path)
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        repack_embeddings(self.model_runner.model)
        return len(tensors)

    def grpo_hub_reload_checkpoint(self) -> None:
        """Reload the checkpoint the server started from (undoes earlier merged syncs: the base of 'adapter')."""
        self.model_runner.reload_weights(is_checkpoint_format=True)
        repack_embeddings(self.model_runner.model)
