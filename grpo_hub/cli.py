"""The `grpo-hub` command. Subcommands are registered in `SUBCOMMANDS` (one `register(subparsers)` each).

    grpo-hub push FOLDER OWNER/NAME [--revision main] [--base-model ID] [--private] [--token T]
    grpo-hub pull OWNER/NAME[@REV] [--output-dir DIR [--merge]] [--base-model ID_OR_PATH] [--token T]
    grpo-hub space deploy OWNER/NAME [--base-model ID] [--adapters SPECS] [--open-models] [--token T]
    grpo-hub compare [--base-model ID] [--adapters SPECS] [--host 127.0.0.1] [--port 7860]
    grpo-hub vllm-serve --model ID_OR_PATH [--port 8000] [--tensor-parallel-size N] [--enable-lora
                        [--max-lora-rank R]] [--dtype auto] [-- VLLM_FLAGS...]

Each prints a few human-readable lines (`--json`: one JSON object for scripts). A failure prints
`grpo-hub: error: <what went wrong and the fix>` to stderr and exits with status 1. A bare `grpo-hub`
prints the help; `--version` the version.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import NoReturn

_JSON = argparse.ArgumentParser(add_help=False)
_JSON.add_argument("--json", action="store_true", help="print one JSON object (for scripts)")


def _short(sha: str | None) -> str:
    return (sha or "")[:7]


def _run_push(args: argparse.Namespace) -> dict:
    from grpo_hub.hub.push import push_adapter

    result = push_adapter(
        args.folder,
        args.repo_id,
        revision=args.revision,
        base_model=args.base_model,
        token=args.token,
        private=args.private,
        commit_message=args.message,
        adapter_name=args.adapter_name,
    )
    return asdict(result)


def _show_push(result: dict) -> str:
    return (
        f"pushed {len(result['files'])} files to {result['repo_id']}@{result['revision']} "
        f"(commit {_short(result['commit_sha'])})\n  {result['commit_url']}"
    )


def _run_pull(args: argparse.Namespace) -> dict:
    from grpo_hub.hub.pull import download_adapter, pull_adapter

    if args.merge and not args.output_dir:
        raise ValueError("--merge writes a merged model folder. Fix: add --output-dir DIR.")
    if not args.output_dir:  # resolve and download the adapter files only: no model is loaded
        return asdict(download_adapter(args.spec, token=args.token))
    _, info = pull_adapter(
        args.spec, base_model=args.base_model, merge=args.merge, output_dir=args.output_dir, token=args.token
    )
    return asdict(info)


def _show_pull(result: dict) -> str:
    lines = [
        f"{result['repo_id']}@{result['revision']} is commit {result['commit_sha']}",
        f"  adapter files: {result['adapter_dir']}",
        f"  base model:    {result['base_model'] or '(not recorded: pass --base-model)'}",
    ]
    if result.get("output_dir"):
        lines.append(f"  written to:    {result['output_dir']}")
    else:
        lines.append("  load it with --output-dir DIR (add --merge for a merged model)")
    return "\n".join(lines)


def register_push(subparsers) -> None:
    push = subparsers.add_parser(
        "push", parents=[_JSON], help="push a trained LoRA adapter (one commit) to a Hub branch"
    )
    push.add_argument("folder", help="trainer output_dir or a checkpoint-<N> folder")
    push.add_argument("repo_id", help="'owner/name' of the model repo (created if missing)")
    push.add_argument("--revision", default="main", help="branch to commit to (created from main if missing)")
    push.add_argument(
        "--base-model", help="Hub id of the base model to record (default: from adapter_config.json)"
    )
    push.add_argument("--private", action="store_true", default=None, help="create the repo as private")
    push.add_argument("--message", help="commit message")
    push.add_argument("--adapter-name", default="default", help="name of the trained adapter (never 'ref')")
    push.add_argument("--token", help="Hub access token (default: HF_TOKEN or the saved login)")
    push.set_defaults(run=_run_push, show=_show_push)


def register_pull(subparsers) -> None:
    pull = subparsers.add_parser(
        "pull",
        parents=[_JSON],
        help="resolve 'owner/name@revision' to its commit and fetch the adapter (--output-dir: load and save it)",
    )
    pull.add_argument("spec", help="'owner/name' or 'owner/name@revision' (branch, tag or commit sha)")
    pull.add_argument("--base-model", help="base model Hub id or folder (default: from adapter_config.json)")
    pull.add_argument("--merge", action="store_true", help="merge the adapter into the base model")
    pull.add_argument(
        "--output-dir",
        help="load the model and write the adapter (or, with --merge, the merged model) here; "
        "without it the files are only downloaded to the HF cache",
    )
    pull.add_argument("--token", help="Hub access token (default: HF_TOKEN or the saved login)")
    pull.set_defaults(run=_run_pull, show=_show_pull)


def _run_space_deploy(args: argparse.Namespace) -> dict:
    from grpo_hub.compare.deploy import deploy_space

    result = deploy_space(
        args.space_id,
        adapters=args.adapters,
        base_model=args.base_model,
        public=not args.open_models,
        private=args.private,
        token=args.token,
    )
    return asdict(result)


def _show_space_deploy(result: dict) -> str:
    variables = "\n".join(f"  {name} = {value}" for name, value in result["variables"].items())
    return (
        f"deployed Space {result['space_id']} (commit {_short(result['commit_sha'])})\n{variables}\n"
        f"open it at {result['url']} (the Space builds for a few minutes first)"
    )


def register_space(subparsers) -> None:
    """`grpo-hub space deploy`: the comparison Space on the Hub."""
    space = subparsers.add_parser("space", help="deploy the comparison Space to the Hub")
    space.set_defaults(help_parser=space)
    deploy = space.add_subparsers(dest="space_command", metavar="ACTION").add_parser(
        "deploy",
        parents=[_JSON],
        help="create or update a Gradio Space comparing a base model with pushed adapters",
    )
    deploy.add_argument("space_id", help="'owner/name' of the Space (created if missing)")
    deploy.add_argument(
        "--adapters", required=True, help="pushed adapters, 'owner/name@revision, owner/other' (up to 4)"
    )
    deploy.add_argument(
        "--base-model",
        help="Hub id of the base model, or an offline model by name (made on the Space): "
        "chain (default), arithmetic, tiny",
    )
    deploy.add_argument(
        "--open-models",
        action="store_true",
        help="let visitors type other model ids (default: the model fields are locked to these)",
    )
    deploy.add_argument("--private", action="store_true", default=None, help="create the Space as private")
    deploy.add_argument("--token", help="Hub access token (default: HF_TOKEN or the saved login)")
    deploy.set_defaults(run=_run_space_deploy, show=_show_space_deploy)


def _run_compare(args: argparse.Namespace) -> dict:
    """Serve the comparison Space until stopped (Ctrl-C); a bad model configuration fails before serving."""
    try:
        from grpo_hub.compare.space import main as serve
    except ImportError as err:
        raise ValueError(f"compare needs gradio ({err}). Fix: pip install 'grpo-hub[space]'.") from err
    serve(args.host, args.port, base_model=args.base_model, adapters=args.adapters)
    return {"served": f"http://{args.host}:{args.port}"}


def register_compare(subparsers) -> None:
    """`grpo-hub compare`: the comparison Space on this machine."""
    compare = subparsers.add_parser(
        "compare",
        help="serve the comparison Space locally: base model vs up to four adapters "
        "(default: the offline chain model and the adapters in ./outputs)",
    )
    compare.add_argument(
        "--base-model",
        help="base model: Hub id, folder, or an offline model: chain, arithmetic, tiny "
        "(default: GRPO_HUB_BASE_MODEL, else chain)",
    )
    compare.add_argument(
        "--adapters",
        help="'owner/name@rev, ./folder, ...' (default: GRPO_HUB_ADAPTERS, else the adapters in ./outputs)",
    )
    compare.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    compare.add_argument("--port", type=int, default=7860, help="port to serve on (default 7860)")
    compare.set_defaults(run=_run_compare)


VLLM_SERVE_HELP = """Start vLLM's OpenAI server with what grpo_hub's server mode needs: grpo_hub's worker extension and
VLLM_SERVER_DEV_MODE=1 (vllm_server_sync='merged'), processed log-probs (the IS correction), runtime LoRA loading and,
with --enable-lora, LoRA up to --max-lora-rank (vllm_server_sync='adapter'); the same command the recipe's
--vllm_server_start runs. It serves trainers with use_vllm=True, vllm_mode='server',
vllm_server_base_url='http://THIS_HOST:PORT', vllm_server_sync 'auto' / 'merged' (and 'adapter' with --enable-lora),
max_staleness >= 0, and a vllm_server_sync_dir this machine reads at the same path (the same machine, or a shared
filesystem). Train the model it serves, in --dtype (the trainer's: float32, or bfloat16 with bf16=True).
Every route but /health needs the bearer token in GRPO_HUB_VLLM_TOKEN (or the file GRPO_HUB_VLLM_TOKEN_FILE names), in
this environment and the trainer's; on 127.0.0.1 (the default) without one, a fresh token is written to a file this
prints. Weights load only from --sync-dir (docs/vllm.md, "Security")."""


def vllm_flags(vllm_args: list[str]) -> list[str]:
    """The vLLM flags given after `--`; one that sets --host or --port is refused (vLLM takes the last one, and
    argparse's abbreviations such as --hos): the server would listen elsewhere than the address checked and printed."""
    from grpo_hub.errors import field_error

    flags = vllm_args[1:] if vllm_args[:1] == ["--"] else vllm_args
    for flag in flags:
        given = flag.split("=", 1)[0]
        for option in ("--host", "--port"):
            if len(given) > 2 and option.startswith(given.replace("_", "-")):
                field_error(
                    option,
                    f"{given} after `--` would change where the server listens.",
                    f"give grpo-hub vllm-serve's own {option} (before `--`).",
                )
    return flags


def _run_vllm_serve(args: argparse.Namespace) -> NoReturn:
    """Replace this process with the vLLM server (its output, signals and exit status are the server's)."""
    import os

    from grpo_hub.generation import server_auth, server_process

    server_process.require_vllm("grpo-hub vllm-serve")
    if args.max_lora_rank is not None and not args.enable_lora:
        raise ValueError("--max-lora-rank bounds the LoRA adapters it serves. Fix: add --enable-lora.")
    argv = server_process.server_command(
        args.model, port=args.port, dtype=args.dtype, host=args.host, max_model_len=args.max_model_len,
        lora_rank=(args.max_lora_rank or 16) if args.enable_lora else None,
        tensor_parallel_size=args.tensor_parallel_size,
    ) + vllm_flags(args.vllm_args)  # fmt: skip
    base, token_line = dict(os.environ), ""
    if server_auth.read_token(base) is None:
        token_file = server_auth.loopback_token_file(args.host, args.port)
        base[server_auth.TOKEN_FILE_ENV] = str(token_file)
        token_line = f"token: a fresh one; trainers on this machine: export {server_auth.TOKEN_FILE_ENV}={token_file}\n"
    sync_dir = args.sync_dir or str(server_auth.default_sync_dir(args.port))
    env = server_process.server_env(base, cores=None, gpus=None, sync_dir=sync_dir)
    added = " ".join(
        f"{k}={v}" for k, v in env.items() if os.environ.get(k) != v and k != server_auth.TOKEN_ENV
    )
    host = "<this machine's address>" if args.host in ("0.0.0.0", "::") else args.host
    print(
        f"grpo-hub vllm-serve: for trainers with use_vllm=True, vllm_mode='server', "
        f"vllm_server_base_url='http://{host}:{args.port}', vllm_server_sync_dir='{env[server_auth.SYNC_DIR_ENV]}'\n"
        f"{token_line}weights load only from {env[server_auth.SYNC_DIR_ENV]}\n"
        f"running: {added} {' '.join(argv)}",
        flush=True,
    )
    os.execve(argv[0], argv, env)


def register_vllm_serve(subparsers) -> None:
    """`grpo-hub vllm-serve`: a vLLM server for grpo_hub's server mode (this machine or another node)."""
    serve = subparsers.add_parser(
        "vllm-serve",
        help="start a vLLM server for grpo_hub's server mode (vllm_mode='server')",
        description=VLLM_SERVE_HELP,
        epilog="further vLLM flags go after `--`, e.g. -- --gpu-memory-utilization 0.5 (not --host or --port: give "
        "this command's own). GPUs: CUDA_VISIBLE_DEVICES. "
        "On CPU the KV cache is VLLM_CPU_KVCACHE_SPACE GiB (1 unless set).",
    )
    serve.add_argument("--model", required=True, help="Hub id or folder: the model the trainer trains")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1: this machine only; another address needs a token set)",
    )
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per model copy (default 1)")
    serve.add_argument(
        "--enable-lora", action="store_true", help="serve LoRA adapters (vllm_server_sync='adapter')"
    )
    serve.add_argument(
        "--max-lora-rank",
        type=int,
        help="largest adapter rank served, rounded up to a bound vLLM takes (default 16)",
    )
    serve.add_argument(
        "--dtype",
        default="auto",
        help="weights' dtype; set the trainer's (default auto: vLLM's, bfloat16 on CPU)",
    )
    serve.add_argument("--max-model-len", type=int, help="longest prompt + completion (default: the model's)")
    serve.add_argument(
        "--sync-dir",
        help="the only folder weights load from, made owner-only; the trainer writes there (default "
        "~/.cache/grpo_hub/vllm-sync-PORT)",
    )
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    serve.set_defaults(run=_run_vllm_serve)


SUBCOMMANDS = (register_push, register_pull, register_space, register_compare, register_vllm_serve)


def build_parser() -> argparse.ArgumentParser:
    import grpo_hub

    parser = argparse.ArgumentParser(
        prog="grpo-hub",
        description="grpo_hub: from a trained GRPO LoRA adapter to the Hub and a comparison Space",
        epilog="walkthrough: grpo-hub push outputs/chain OWNER/chain-grpo; "
        "grpo-hub space deploy OWNER/chain-grpo-space --base-model chain --adapters OWNER/chain-grpo@main",
    )
    parser.add_argument("--version", action="version", version=f"grpo-hub {grpo_hub.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `grpo-hub` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:  # a bare `grpo-hub` (or `grpo-hub space`): the help
        (args.help_parser if hasattr(args, "help_parser") else parser).print_help()
        return 0
    from grpo_hub.hub.errors import HubError

    try:
        result = args.run(args)
    except (HubError, ValueError) as err:
        print(f"grpo-hub: error: {err}", file=sys.stderr)
        return 1
    show = getattr(args, "show", None)
    print(json.dumps(result) if getattr(args, "json", False) or show is None else show(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
