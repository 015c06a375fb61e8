"""The `grpo-hub` command. Subcommands are registered in `SUBCOMMANDS` (one `register(subparsers)` each).

    grpo-hub push FOLDER OWNER/NAME [--revision main] [--base-model ID] [--private] [--token T]
    grpo-hub pull OWNER/NAME[@REV] [--base-model ID_OR_PATH] [--merge] [--output-dir DIR] [--token T]
    grpo-hub compare [--host 127.0.0.1] [--port 7860]   (serves the comparison Space until stopped)

Both print one JSON line (repo, revision, pinned commit sha, ...). A failure prints
`grpo-hub: error: <what went wrong and the fix>` to stderr and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict


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


def _run_pull(args: argparse.Namespace) -> dict:
    from grpo_hub.hub.pull import pull_adapter

    if args.merge and not args.output_dir:
        raise ValueError("--merge writes a merged model folder. Fix: add --output-dir DIR.")
    _, info = pull_adapter(
        args.spec, base_model=args.base_model, merge=args.merge, output_dir=args.output_dir, token=args.token
    )
    return asdict(info)


def register_push(subparsers) -> None:
    push = subparsers.add_parser("push", help="push a trained LoRA adapter (one commit) to a Hub branch")
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
    push.set_defaults(run=_run_push)


def register_pull(subparsers) -> None:
    pull = subparsers.add_parser(
        "pull", help="load an adapter from 'owner/name@revision' (pinned to its commit)"
    )
    pull.add_argument("spec", help="'owner/name' or 'owner/name@revision' (branch, tag or commit sha)")
    pull.add_argument("--base-model", help="base model Hub id or folder (default: from adapter_config.json)")
    pull.add_argument("--merge", action="store_true", help="merge the adapter into the base model")
    pull.add_argument("--output-dir", help="write the adapter (or, with --merge, the merged model) here")
    pull.add_argument("--token", help="Hub access token (default: HF_TOKEN or the saved login)")
    pull.set_defaults(run=_run_pull)


def _run_compare(args: argparse.Namespace) -> dict:
    """Serve the comparison Space until stopped (Ctrl-C); a bad model configuration fails before serving."""
    try:
        from grpo_hub.compare.space import main as serve
    except ImportError as err:
        raise ValueError(f"compare needs gradio ({err}). Fix: pip install 'grpo-hub[space]'.") from err
    serve(args.host, args.port)
    return {"served": f"http://{args.host}:{args.port}"}


def register_compare(subparsers) -> None:
    """`grpo-hub compare`: the comparison Space on this machine."""
    compare = subparsers.add_parser(
        "compare",
        help="serve the comparison Space locally: base model vs adapters (GRPO_HUB_BASE_MODEL, GRPO_HUB_ADAPTERS; "
        "default: the offline tiny model and the adapters in ./outputs)",
    )
    compare.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    compare.add_argument("--port", type=int, default=7860, help="port to serve on (default 7860)")
    compare.set_defaults(run=_run_compare)


SUBCOMMANDS = (register_push, register_pull, register_compare)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-hub", description="grpo_hub: Hub workflow for GRPO LoRA adapters"
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    for register in SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `grpo-hub` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    from grpo_hub.hub.errors import HubError

    try:
        result = args.run(args)
    except (HubError, ValueError) as err:
        print(f"grpo-hub: error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
