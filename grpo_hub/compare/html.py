"""HTML of one comparison column, text escaped: the model's label and provenance (commit, step, variant),
its mean rewards with the difference to the base, then each completion (plain, or diffed against the base's)
with its rewards. Reward functions that do not apply to the prompt (None scores) are left out.
"""

from __future__ import annotations

import html

from grpo_hub.compare.scoring import Column


def _applicable(column: Column) -> dict[str, list[float]]:
    return {name: values for name, values in column.rewards.items() if values is not None}


def _provenance_html(column: Column) -> str:
    """'commit abc1234 · step 30 · dapo' (the commit linked) for what is known, else ''."""
    info, parts = column.provenance, []
    if "commit" in info:
        sha = html.escape(info["commit"][:7])
        url = html.escape(info.get("url", ""))
        parts.append(
            f'commit <a class="commit" href="{url}" target="_blank">{sha}</a>' if url else f"commit {sha}"
        )
    if "step" in info:
        parts.append(f'step <span class="step">{int(info["step"])}</span>')
    if "variant" in info:
        parts.append(f'<span class="variant">{html.escape(str(info["variant"]))}</span>')
    return f'<p class="provenance">{" · ".join(parts)}</p>' if parts else ""


def _mean_html(column: Column, name: str, base: Column | None) -> str:
    """One list item: the mean of reward `name` over the column, and its difference to the base's mean."""
    mean = column.mean_reward(name)
    delta = None if base is None or base is column else mean - base.mean_reward(name)
    shown = f"{mean:.3f}" + ("" if delta is None else f' <span class="delta">({delta:+.3f} vs base)</span>')
    return (
        f'<li class="mean-reward" data-name="{html.escape(name)}" data-value="{mean}" '
        f'data-delta="{"" if delta is None else delta}">mean {html.escape(name)}: {shown}</li>'
    )


def _sample_html(column: Column, i: int, show_diff: bool) -> str:
    """One list item: completion i (diffed against the base's when asked and available) and its rewards."""
    esc = html.escape
    completion = column.completions[i]
    if column.diffs is None or not show_diff:
        text = esc(completion)
    else:
        tags = {None: "{}", "+": "<ins>{}</ins>", "-": "<del>{}</del>"}
        text = "".join(tags[label].format(esc(part)) for part, label in column.diffs[i])
    rewards = " ".join(
        f'<span class="reward" data-name="{esc(name)}" data-value="{values[i]}">{esc(name)}={values[i]:.3f}</span>'
        for name, values in _applicable(column).items()
    )
    return (
        f'<li class="sample" data-text="{esc(completion)}"><pre class="completion">{text}</pre>{rewards}</li>'
    )


def column_html(column: Column, *, base: Column | None = None, show_diff: bool = False) -> str:
    """HTML of one column; `base` adds the differences of the mean rewards, `show_diff` the word diffs."""
    means = "".join(_mean_html(column, name, base) for name in _applicable(column))
    samples = "".join(_sample_html(column, i, show_diff) for i in range(len(column.completions)))
    return (
        f'<div class="model-column"><h3>{html.escape(column.label)}</h3>{_provenance_html(column)}'
        f'<ul class="means">{means}</ul><ol class="samples">{samples}</ol></div>'
    )
