"""benchmarks/gpu_check.py: its command matrix, its table, its exit status; the CUDA paths fail clearly
without a GPU. (The runs themselves are the recipe's, tested in tests/recipes.)"""

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.__main__ import main as benchmarks_main
from benchmarks.filtering import main as filtering_main


def test_dry_run_lists_every_config_and_recipe_with_one_process(capsys):
    assert gpu_check.main(["--dry-run"]) == 0
    commands = capsys.readouterr().out.strip().splitlines()
    assert len(commands) == len(gpu_check.ACCELERATE_CONFIGS) * len(gpu_check.RECIPES) == 8
    assert all("--num_processes 1" in c and "--max_steps 30" in c for c in commands)
    assert any("zero3.yaml" in c and "ref-refresh.yaml" in c for c in commands)


def test_cpu_matrix_leaves_out_fsdp2(capsys):
    gpu_check.main(["--dry-run", "--cpu"])
    commands = capsys.readouterr().out.strip().splitlines()
    assert len(commands) == 6 and not any("fsdp2" in c for c in commands)


def test_cpu_matrix_uses_the_cpu_deepspeed_configs(capsys):
    gpu_check.main(["--dry-run", "--cpu", "--configs", "zero3", "--recipes", "grpo"])
    (command,) = capsys.readouterr().out.strip().splitlines()
    assert (
        "cpu-zero3.yaml" in command
        and "--use_cpu true --bf16 false" in command
        and "--max_steps 3" in command
    )


def result(code, first=None, last=None):
    return {
        "exit": code,
        "reward_first": first,
        "reward_last": last,
        "seconds": 12.0,
        "tail": "ValueError: boom",
    }


def test_table_marks_expected_refusals_and_failures():
    rows = gpu_check.table(
        {
            ("single", "grpo"): result(0, 0.15, 1.0),
            ("zero3", "ref-refresh"): result(1),
            ("fsdp2", "ref-refresh"): result(1),
        }
    ).splitlines()
    assert rows[2] == "| single | grpo | 0 | 0.150 -> 1.000 | 12 |  |"
    assert rows[3].startswith("| zero3 | ref-refresh | 1 | - |") and "FAILED: ValueError: boom" in rows[3]
    assert rows[4].endswith("| refused by design: FSDP + reference adapter |")


def test_exit_status_counts_unexpected_outcomes(monkeypatch, tmp_path):
    outcomes = {"grpo": result(0, 0.1, 0.9), "ref-refresh": result(0, 0.1, 0.9)}
    monkeypatch.setattr(
        gpu_check,
        "run_one",
        lambda cmd, out, timeout: outcomes[cmd[cmd.index("--config") + 1].split("/")[-1][:-5]],
    )
    assert gpu_check.main(["--cpu", "--configs", "single"]) == 0
    assert gpu_check.main(["--cpu", "--configs", "fsdp2"]) == 1  # fsdp2 + ref-refresh ran: unexpected


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a CUDA GPU")
@pytest.mark.parametrize(
    "main", [benchmarks_main, filtering_main], ids=["benchmarks", "benchmarks.filtering"]
)
def test_device_cuda_without_a_gpu_fails_with_the_fix(main):
    with pytest.raises(SystemExit) as exit_info:
        main(["--device", "cuda"])
    message = str(exit_info.value.code)
    assert "--device cuda" in message and "sees no CUDA GPU" in message and "--device cpu" in message
