"""benchmarks/gpu/gpu_check.py: its command matrix, its table, its exit status; the CUDA paths fail clearly
without a GPU. (The runs themselves are the recipe's, tested in tests/recipes.)"""

import sys

import pytest
import torch

from benchmarks.__main__ import main as benchmarks_main
from benchmarks.accuracy.time_to_accuracy import main as time_to_accuracy_main
from benchmarks.gpu import gpu_check
from benchmarks.step_cost.filtering import main as filtering_main
from benchmarks.step_cost.padding_free import main as padding_free_main
from benchmarks.step_cost.scoring_forward import main as scoring_forward_main


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
        "cause": "ValueError: boom" if code else "",
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
        lambda cmd, out, timeout, log=None: outcomes[cmd[cmd.index("--config") + 1].split("/")[-1][:-5]],
    )
    assert gpu_check.main(["--cpu", "--configs", "single"]) == 0
    assert gpu_check.main(["--cpu", "--configs", "fsdp2"]) == 1  # fsdp2 + ref-refresh ran: unexpected


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a CUDA GPU")
@pytest.mark.parametrize(
    "main",
    [benchmarks_main, filtering_main, scoring_forward_main, time_to_accuracy_main, padding_free_main],
    ids=[
        "benchmarks",
        "benchmarks.filtering",
        "benchmarks.scoring_forward",
        "benchmarks.time_to_accuracy",
        "benchmarks.padding_free",
    ],  # fmt: skip
)
def test_device_cuda_without_a_gpu_fails_with_the_fix(main, monkeypatch):
    monkeypatch.setattr("sys.argv", ["benchmark", "--device", "cuda"])  # these two read sys.argv
    with pytest.raises(SystemExit) as exit_info:
        main() if main in (time_to_accuracy_main, padding_free_main) else main(["--device", "cuda"])
    message = str(exit_info.value.code)
    assert "--device cuda" in message and "sees no CUDA GPU" in message and "--device cpu" in message


def test_runs_at_once_each_get_their_own_port(capsys):
    gpu_check.main(["--dry-run", "--jobs", "4"])
    commands = capsys.readouterr().out.strip().splitlines()
    ports = [c.split("--main_process_port ")[1].split()[0] for c in commands]
    assert len(set(ports)) == len(commands) == 8


LAUNCHER_FAILURE = """\
[rank0]:   File "recipes/grpo.py", line 10, in main
[rank0]: RuntimeError: FSDP2 cannot shard a tied weight twice
E1126 19:56:04 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 14927)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
"""


def test_a_failure_is_named_by_the_childs_exception_not_the_launchers():
    assert (
        gpu_check.failure_cause(LAUNCHER_FAILURE)
        == "[rank0]: RuntimeError: FSDP2 cannot shard a tied weight twice"
    )
    assert gpu_check.failure_cause("no exception\nat all") == "no exception at all"


def test_each_runs_whole_output_is_kept_with_logs(tmp_path):
    script = "import sys; print('ValueError: early'); print('line'); sys.exit(3)"
    log = tmp_path / "run.log"
    result = gpu_check.run_one([sys.executable, "-c", script], tmp_path, timeout=60, log=log)
    assert result["exit"] == 3 and result["cause"] == "ValueError: early"
    assert log.read_text() == "ValueError: early\nline\n" and result["reward_first"] is None
