"""Model card and reward-curve image for a pushed adapter.

The card is a `huggingface_hub.ModelCard` rendered from `CARD_TEMPLATE`; its YAML front matter comes from
`ModelCardData` (base_model, library_name "peft", tags trl/grpo/grpo-hub/<loss variant>). The body lists
the training config that matters, the final metrics and the reward curve drawn from the trainer's
`log_history` (matplotlib, Agg canvas, no GUI). Token-like config fields are never written.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping

REWARD_CURVE = "reward_curve.png"
# Front-matter key naming the branch a card was pushed to: a branch whose card names another branch holds no
# adapter of its own (e.g. a push was interrupted after creating the branch from main; see hub/pull.py).
PUSHED_REVISION = "grpo_hub_revision"
BASE_TAGS = ("trl", "grpo", "grpo-hub", "lora")
# TRL fields that shape a GRPO run; grpo_hub's own config fields are added on top (see `training_config`).
TRL_CONFIG_KEYS = (
    "learning_rate",
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "max_completion_length",
    "temperature",
    "beta",
    "epsilon",
    "epsilon_high",
    "delta",
    "loss_type",
    "importance_sampling_level",
    "scale_rewards",
    "num_iterations",
    "mask_truncated_completions",
    "lr_scheduler_type",
    "seed",
)
LORA_KEYS = {
    "r": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "target_modules": "target_modules",
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ repo_id }}

A LoRA adapter trained with GRPO (loss variant `{{ variant }}`) using
[grpo_hub](https://pypi.org/project/grpo-hub/) {{ grpo_hub_version }} on TRL {{ trl_version }}.
{% if base_model %}Base model: `{{ base_model }}`.{% endif %}
{% if step is not none %}Revision `{{ revision }}` holds the adapter at training step {{ step }}.{% endif %}

## Use it

```bash
grpo-hub pull {{ repo_id }}@{{ revision }}                              # PeftModel on its base model
grpo-hub pull {{ repo_id }}@{{ revision }} --merge --output-dir merged  # merged model folder
```

```python
from grpo_hub.hub import pull_adapter

model, info = pull_adapter("{{ repo_id }}@{{ revision }}")
print(info.commit_sha)  # the exact commit that was loaded
```

## Training config

{% if config %}| setting | value |
|---|---|
{% for key, value in config.items() %}| `{{ key }}` | {{ value }} |
{% endfor %}{% else %}Not recorded.{% endif %}

## Final metrics

{% if metrics %}| metric | value |
|---|---|
{% for key, value in metrics.items() %}| `{{ key }}` | {{ value }} |
{% endfor %}{% else %}No metrics were logged.{% endif %}

## Reward curve

{% if has_curve %}![Mean reward per logged step]({{ curve }}){% else %}No reward was logged.{% endif %}
"""


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def hub_model_id(name: str | None) -> str | None:
    """`name` if it can be a Hub model id (not a local path), else None; only ids go into card metadata."""
    if not name or os.path.exists(name) or not _HUB_ID.match(name):
        return None
    return name


def loss_variant(config: Mapping) -> str:
    """The GRPO-family variant a config trains: gspo (sequence-level ratios), else TRL's loss_type."""
    if config.get("importance_sampling_level") == "sequence":
        return "gspo"
    return str(config.get("loss_type") or "grpo")


def training_config(args, adapter_config: Mapping | None = None) -> dict:
    """Settings that matter from a TrainingArguments/GRPOConfig (or a dict) and the LoRA config.

    Keeps `TRL_CONFIG_KEYS` plus every field declared by a grpo_hub config class; drops token-like names.
    """
    keys = set(TRL_CONFIG_KEYS)
    if args is not None and not isinstance(args, Mapping):
        for cls in type(args).__mro__:
            if cls.__module__.startswith("grpo_hub"):
                keys |= set(getattr(cls, "__annotations__", {}))
        args = args.to_dict() if hasattr(args, "to_dict") else vars(args)
    out = {k: v for k, v in sorted((args or {}).items()) if k in keys and "token" not in k.lower()}
    out = {k: v for k, v in out.items() if isinstance(v, str | int | float | bool) or v is None}
    for source, key in LORA_KEYS.items():
        if adapter_config and source in adapter_config:
            value = adapter_config[source]
            out[key] = ", ".join(sorted(value)) if isinstance(value, list) else value
    return out


def final_metrics(log_history: list[dict]) -> dict:
    """Numeric values of the last log entry with a reward, plus the run summary (train_loss, runtime)."""
    metrics: dict = {}
    last = next((entry for entry in reversed(log_history) if "reward" in entry), None)
    summary = next((entry for entry in reversed(log_history) if "train_runtime" in entry), {})
    for entry in (last or {}, summary):
        metrics.update(
            {k: v for k, v in entry.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        )
    return metrics


def reward_curve_png(log_history: list[dict]) -> bytes | None:
    """PNG of mean reward (± std band) and per-function rewards against the step; None without rewards."""
    points = [e for e in log_history if "reward" in e and "step" in e]
    if not points:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = [e["step"] for e in points]
    mean = [e["reward"] for e in points]
    figure = Figure(figsize=(6, 3.5), dpi=100)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    if all("reward_std" in e for e in points):
        std = [e["reward_std"] for e in points]
        ax.fill_between(
            steps,
            [m - s for m, s in zip(mean, std, strict=True)],
            [m + s for m, s in zip(mean, std, strict=True)],
            alpha=0.2,
        )
    ax.plot(steps, mean, marker="o", label="reward (mean)")
    per_function = sorted({k for e in points for k in e if k.startswith("rewards/") and k.endswith("/mean")})
    if len(per_function) > 1:
        for key in per_function:
            ax.plot(steps, [e.get(key) for e in points], linestyle="--", label=key.split("/")[1])
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title("GRPO reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def pushed_revision(card_text: str) -> str | None:
    """The branch a grpo_hub card was pushed to (its `PUSHED_REVISION` front matter); None for other cards."""
    from huggingface_hub import ModelCard

    value = ModelCard(card_text, ignore_metadata_errors=True).data.to_dict().get(PUSHED_REVISION)
    return value if isinstance(value, str) else None


def build_model_card(
    *,
    repo_id: str,
    revision: str,
    base_model: str | None,
    config: Mapping,
    metrics: Mapping,
    step: int | None,
    has_curve: bool,
):
    """A `ModelCard` whose YAML validates on the Hub (base_model only when it is a Hub id)."""
    import trl
    from huggingface_hub import ModelCard, ModelCardData

    import grpo_hub

    variant = loss_variant(config)
    data = ModelCardData(
        base_model=hub_model_id(base_model),
        library_name="peft",
        pipeline_tag="text-generation",
        tags=[*BASE_TAGS, variant],
        **{PUSHED_REVISION: revision},
    )
    return ModelCard.from_template(
        data,
        template_str=CARD_TEMPLATE,
        repo_id=repo_id,
        revision=revision,
        base_model=base_model,
        variant=variant,
        step=step,
        config={k: _fmt(v) for k, v in config.items()},
        metrics={k: _fmt(v) for k, v in metrics.items()},
        has_curve=has_curve,
        curve=REWARD_CURVE,
        grpo_hub_version=grpo_hub.__version__,
        trl_version=trl.__version__,
    )
