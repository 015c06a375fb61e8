"""The pure-math modules must import torch only: no trl, no transformers (checked in a fresh interpreter)."""

import json
import subprocess
import sys

PURE_MODULES = ["grpo_hub.advantages", "grpo_hub.losses", "grpo_hub.importance"]


def test_pure_modules_import_neither_trl_nor_transformers():
    code = (
        "import json, sys\n"
        f"for name in {PURE_MODULES!r}: __import__(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {'trl', 'transformers', 'grpo_hub'})))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(result.stdout)
    assert set(PURE_MODULES) <= set(loaded)  # the import really happened
    assert [m for m in loaded if not m.startswith("grpo_hub")] == []
