"""Every module of grpo_hub/algos must import torch only: no trl, transformers, peft, accelerate (fresh interpreter)."""

import json
import pkgutil
import subprocess
import sys

import grpo_hub.algos

PURE_MODULES = sorted(f"grpo_hub.algos.{m.name}" for m in pkgutil.iter_modules(grpo_hub.algos.__path__))
HEAVY = {"trl", "transformers", "peft", "accelerate", "datasets", "deepspeed", "vllm"}


def test_the_whole_algos_folder_is_checked():
    assert {
        "grpo_hub.algos.advantages",
        "grpo_hub.algos.losses",
        "grpo_hub.algos.filtering",
        "grpo_hub.algos.packing",
    } <= set(PURE_MODULES)


def test_pure_modules_import_no_training_stack():
    code = (
        "import json, sys\n"
        f"for name in {PURE_MODULES!r}: __import__(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{sorted(HEAVY | {'grpo_hub'})!r})))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(result.stdout)
    assert set(PURE_MODULES) <= set(loaded)  # the import really happened
    assert [m for m in loaded if not m.startswith("grpo_hub")] == []
    assert {m for m in loaded if m.startswith("grpo_hub.")} <= {*PURE_MODULES, "grpo_hub.algos"}
