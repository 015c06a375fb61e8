"""Compare completions of a base model and up to four LoRA adapters on one prompt.

```python
from grpo_hub.compare import Sampling, load_bank, compare
bank = load_bank("path/to/base", ("outputs/run-a", "user/adapter@v1"))
columns = compare(bank, "Repeat the letter k: k", Sampling(n=4, seed=0), ["letter_fraction_reward"])
```
`bank` loads the models, `scoring` generates, scores and diffs the columns, `html` renders a column, and
`space` is the Gradio UI (needs the `space` extra) that `spaces_app/app.py` and `grpo-hub compare` serve.
"""

from grpo_hub.compare.bank import (
    BASE_LABEL,
    MAX_ADAPTERS,
    CompareError,
    Limits,
    ModelBank,
    Sampling,
    check_base_match,
    discover_adapters,
    load_bank,
    parse_adapter_specs,
    resolve_adapter,
)
from grpo_hub.compare.html import column_html
from grpo_hub.compare.scoring import (
    Column,
    compare,
    diff_segments,
    example_prompts,
    reward_functions,
    score,
    task_rows,
)

__all__ = [
    "BASE_LABEL",
    "MAX_ADAPTERS",
    "Column",
    "CompareError",
    "Limits",
    "ModelBank",
    "Sampling",
    "check_base_match",
    "column_html",
    "compare",
    "diff_segments",
    "discover_adapters",
    "example_prompts",
    "load_bank",
    "parse_adapter_specs",
    "resolve_adapter",
    "reward_functions",
    "score",
    "task_rows",
]
