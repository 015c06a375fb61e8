"""HTML of one comparison column (label, mean rewards, completions diffed against the base), text escaped."""

from __future__ import annotations

import html

from grpo_hub.compare.scoring import Column


def _mean_html(column: Column, name: str) -> str:
    """One list item with the mean of reward `name` over the column (value also in data-value)."""
    mean = column.mean_reward(name)
    shown = "n/a (needs a prompt of its task)" if mean is None else f"{mean:.3f}"
    return f'<li class="mean-reward" data-name="{html.escape(name)}" data-value="{mean}">mean {html.escape(name)}: {shown}</li>'


def _sample_html(column: Column, i: int) -> str:
    """One list item: completion i (diffed against the base's when the column has diffs) and its rewards."""
    esc = html.escape
    completion = column.completions[i]
    if column.diffs is None:
        text = esc(completion)
    else:
        tags = {None: "{}", "+": "<ins>{}</ins>", "-": "<del>{}</del>"}
        text = "".join(tags[label].format(esc(part)) for part, label in column.diffs[i])
    rewards = " ".join(
        f'<span class="reward" data-name="{esc(name)}" data-value="{values[i]}">{esc(name)}={values[i]:.3f}</span>'
        for name, values in column.rewards.items()
        if values is not None
    )
    return (
        f'<li class="sample" data-text="{esc(completion)}"><pre class="completion">{text}</pre>{rewards}</li>'
    )


def column_html(column: Column) -> str:
    """HTML of one column: its label, mean rewards, then each completion with its rewards (text escaped)."""
    means = "".join(_mean_html(column, name) for name in column.rewards)
    samples = "".join(_sample_html(column, i) for i in range(len(column.completions)))
    return (
        f'<div class="model-column"><h3>{html.escape(column.label)}</h3><ul class="means">{means}</ul>'
        f'<ol class="samples">{samples}</ol></div>'
    )
