"""FiniteGradientsCallback's check (grpo_hub/training/finite_guard.py) on FSDP2's sharded gradients: they are DTensors,
whose `.tolist()` torch refuses (an FSDP2 run on an H100 failed at its first optimizer step there). One CPU process
with gloo, in a subprocess (it initialises torch.distributed)."""

import subprocess
import sys
import textwrap

from tests.conftest import REPO_ROOT, RUN_LIMIT_S, free_port

SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from grpo_hub.training.finite_guard import nonfinite_gradients

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    mesh = init_device_mesh("cpu", (1,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model(torch.randn(4, 8)).sum().backward()
    grad = model[1].weight.grad
    assert type(grad).__name__ == "DTensor", type(grad)
    assert nonfinite_gradients(model) == []
    grad.to_local()[0, 0] = float("inf")
    assert nonfinite_gradients(model) == ["1.weight"], nonfinite_gradients(model)
    dist.destroy_process_group()
    print("ok")
    """
)


def test_fsdp2_gradients_are_checked_shard_by_shard():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(free_port())],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
