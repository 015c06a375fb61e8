"""Two real gloo ranks building one cached offline model: `build_on_two_ranks` spawns them and reports who built.

Each rank points `$GRPO_HUB_CACHE` at the test's folder, joins a gloo group of 2 (asserted), records every build it
runs (a line in `builds.log`) and returns the folder its builder gave. With `first` set, that rank builds first and
the other calls the builder only once the first one's build has started, so the order is fixed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.conftest import free_port

SHORT_SFT = {"steps": 2, "batch_size": 4}
TIMEOUT = 300


def builders() -> dict:
    """Builder name -> (its module, a call building its default cached folder)."""
    from grpo_hub.tasks import arithmetic_model, chain_model, tiny_model

    return {
        "tiny": (tiny_model, tiny_model.build_tiny_model),
        "chain": (chain_model, lambda: chain_model.build_chain_model(sft=SHORT_SFT)),
        "arithmetic": (arithmetic_model, lambda: arithmetic_model.build_arithmetic_model(sft=SHORT_SFT)),
    }


def record_builds(module, rank: int, run: Path) -> None:
    """Wrap `module._write_model` so each build appends the rank to `builds.log` and marks `started`."""
    write = module._write_model

    def recorded(folder, *args):
        with open(run / "builds.log", "a") as log:
            log.write(f"{rank}\n")
        (run / "started").touch()
        time.sleep(1)  # the other rank arrives while this build runs
        write(folder, *args)

    module._write_model = recorded


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


def rank_main(rank: int, port: int, cache: str, run: str, builder: str, first: int | None) -> None:
    os.environ["GRPO_HUB_CACHE"] = cache
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        assert dist.get_world_size() == 2 and dist.is_initialized()
        run_dir = Path(run)
        module, build = builders()[builder]
        record_builds(module, rank, run_dir)
        if first is not None and rank != first:
            wait_for(run_dir / "started")
        folder = build()
        (run_dir / f"rank{rank}.json").write_text(json.dumps({"folder": folder}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def build_on_two_ranks(
    cache: Path, run: Path, builder: str, first: int | None
) -> tuple[list[int], list[str]]:
    """Spawn 2 gloo ranks building `builder` into `cache`; return (ranks that built, folder each rank got)."""
    run.mkdir(parents=True)
    context = mp.start_processes(
        rank_main,
        args=(free_port(), str(cache), str(run), builder, first),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + TIMEOUT
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"2 ranks building {builder} did not finish in {TIMEOUT} s")
    log = run / "builds.log"
    builders = [int(line) for line in log.read_text().split()] if log.exists() else []
    folders = [json.loads((run / f"rank{rank}.json").read_text())["folder"] for rank in (0, 1)]
    return builders, folders
