"""Gradio Space: completions of a base model next to those of up to four LoRA adapters.

Served by `spaces_app/app.py` (on a Space), `python -m spaces_app` or `grpo-hub compare` (locally).
Configuration (environment variables, all optional):
  GRPO_HUB_BASE_MODEL   base model id or folder, or an offline model of grpo_hub.tasks by name: chain
                        (default), arithmetic, tiny
  GRPO_HUB_ADAPTERS     "owner/name@revision, ./local/folder, ..." (default: the adapters of the base
                        found in GRPO_HUB_OUTPUT_DIR, default "outputs", where the training recipes save)
  GRPO_HUB_PUBLIC       "1": the model fields are locked to the configured models (set by `grpo-hub space
                        deploy` unless --open-models), so visitors cannot make the Space load other models
  GRPO_HUB_MAX_PROMPT_CHARS, GRPO_HUB_MAX_NEW_TOKENS, GRPO_HUB_MAX_SAMPLES, GRPO_HUB_QUEUE_SIZE  caps
  HF_TOKEN              read access to private adapters
The comparison itself (loading, seeded generation, rewards, diffs) lives in bank / scoring / html. Each
column shows plain completions (word diffs against the base behind a toggle); a bar chart shows the mean
rewards per model.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import gradio as gr
import pandas as pd

from grpo_hub.compare.bank import (
    MAX_ADAPTERS,
    MAX_SEED,
    CompareError,
    Limits,
    Sampling,
    discover_adapters,
    load_bank,
    parse_adapter_specs,
)
from grpo_hub.compare.deploy import ADAPTERS_VARIABLE, BASE_VARIABLE, PUBLIC_VARIABLE
from grpo_hub.compare.html import column_html
from grpo_hub.compare.scoring import Column, compare, example_label, example_prompts, reward_functions

logger = logging.getLogger(__name__)

CSS = """
ins { background: #c9f2c9; text-decoration: none; }
del { background: #f8c9c9; }
.model-column pre { white-space: pre-wrap; word-break: break-all; margin: 0.2em 0; }
"""
INTRO = (
    "# GRPO adapters vs their base\n"
    "Every column samples the prompt with the **same seed**, so sample *i* of an adapter differs from sample "
    "*i* of the base only because of the adapter. Tick *Show differences* to mark the words that changed: "
    "<ins>green</ins> is new in the adapter, <del>red</del> is the base's."
)
CHART_COLUMNS = ("model", "mean reward", "reward function")


def default_config(base_model: str | None = None, adapters: str | None = None) -> tuple[str, str]:
    """(base model, adapters text): the arguments, else the environment, else the offline chain model and
    the adapters of it found in GRPO_HUB_OUTPUT_DIR. A base named in `grpo_hub.tasks.OFFLINE_MODELS`
    ("chain", "arithmetic", "tiny") is resolved offline: shipped with the package, or built (or cached)."""
    from grpo_hub.tasks import DEFAULT_COMPARE_BASE, OFFLINE_MODELS

    base = base_model or os.environ.get(BASE_VARIABLE) or DEFAULT_COMPARE_BASE
    if base in OFFLINE_MODELS:
        base = OFFLINE_MODELS[base]()
    adapters = adapters if adapters is not None else os.environ.get(ADAPTERS_VARIABLE)
    if adapters is None:
        adapters = ", ".join(discover_adapters(os.environ.get("GRPO_HUB_OUTPUT_DIR", "outputs"), base))
    return base, adapters


def read_sampling(temperature, top_p, max_new_tokens, seed, n) -> Sampling:
    """Sampling from the UI controls; an empty or non-numeric control is a CompareError."""
    try:
        return Sampling(float(temperature), float(top_p), int(max_new_tokens), int(seed), int(n))
    except (TypeError, ValueError, OverflowError) as error:  # int(inf) overflows, int(nan) is a ValueError
        raise CompareError(
            f"every sampling control needs a number ({error}): fill in the empty one"
        ) from error


def is_public() -> bool:
    """Whether the model fields are locked to the configured models (GRPO_HUB_PUBLIC=1)."""
    return os.environ.get(PUBLIC_VARIABLE, "0").strip() == "1"


def short_label(label: str) -> str:
    """A model's name for the chart: a Hub spec as given, a folder by its name."""
    return Path(label).name if label.count("/") != 1 else label


def reward_chart(columns: list[Column]) -> pd.DataFrame:
    """Rows (model, mean reward, reward function) of every reward that applies to the prompt."""
    rows = [
        (short_label(column.label), column.mean_reward(name), name)
        for column in columns
        for name, values in column.rewards.items()
        if values is not None
    ]
    return pd.DataFrame(rows, columns=list(CHART_COLUMNS))


def render_columns(columns: list[Column] | None, show_diff: bool) -> list:
    """One visible HTML slot per column (base first, the others with their difference to it), rest hidden."""
    columns = columns or []
    html = [column_html(c, base=columns[0], show_diff=bool(show_diff)) for c in columns]
    hidden = [gr.HTML(value="", visible=False) for _ in range(MAX_ADAPTERS + 1 - len(html))]
    return [gr.HTML(value=h, visible=True) for h in html] + hidden


def run_compare(
    base, adapters, prompt, temperature, top_p, max_new_tokens, seed, n, rewards, show_diff=False
):
    """Gradio handler: the column slots, the reward chart and the columns (kept to re-render the diffs).

    Every failure reaches the page as a `gr.Error` that stays until the user closes it: a CompareError with
    its message, anything unexpected as its type and message (the traceback goes to the server log).
    """
    try:
        sampling = read_sampling(temperature, top_p, max_new_tokens, seed, n)
        bank = load_bank((base or "").strip(), parse_adapter_specs(adapters))
        columns = compare(bank, prompt, sampling, list(rewards or []), Limits.from_env())
    except CompareError as error:
        raise gr.Error(str(error), duration=None) from error
    except Exception as error:
        logger.exception("compare failed")
        raise gr.Error(
            f"the comparison failed unexpectedly ({type(error).__name__}: {error}); the server log has the details",
            duration=None,
        ) from error
    chart = reward_chart(columns)
    order = list(dict.fromkeys(chart[CHART_COLUMNS[0]]))  # base first, then the adapters as listed
    plot = gr.BarPlot(value=chart, sort=order, visible=not chart.empty)
    return [*render_columns(columns, show_diff), plot, columns]


def build_demo(base: str, adapters: str, public: bool = False) -> gr.Blocks:
    """The Blocks UI: models, prompt + examples, sampling controls, rewards, chart, one column per model.

    `public`: the model fields are read-only and the handler always uses `base` and `adapters`. Max new tokens
    starts at the default task's longest answer (a level-4 chain scratchpad), capped by the limit.
    """
    from grpo_hub.tasks.chain import MAX_COMPLETION_TOKENS

    limits = Limits.from_env()
    locked = "locked by the Space's configuration" if public else "owner/name@revision or folder"
    with gr.Blocks(title="grpo_hub: compare adapters") as demo:
        gr.Markdown(INTRO)
        with gr.Accordion("Models", open=False):
            base_box = gr.Textbox(
                base, label=f"Base model ({locked})", elem_id="base-model", interactive=not public
            )
            adapters_box = gr.Textbox(
                adapters,
                label=f"Adapters, up to {MAX_ADAPTERS}, comma-separated ({locked})",
                elem_id="adapters",
                interactive=not public,
            )
        prompt = gr.Textbox(label="Prompt", lines=2, max_length=limits.max_prompt_chars, elem_id="prompt")
        examples = example_prompts()
        gr.Examples(
            examples,
            inputs=prompt,
            label="Prompts of the built-in tasks",
            example_labels=[example_label(text) for text in examples],
        )
        with gr.Row():
            temperature = gr.Slider(0, 2, value=1.0, step=0.05, label="Temperature (0 = greedy)")
            top_p = gr.Slider(0.05, 1, value=1.0, step=0.05, label="Top-p")
            max_new = gr.Slider(
                1,
                limits.max_new_tokens,
                value=min(MAX_COMPLETION_TOKENS, limits.max_new_tokens),
                step=1,
                label="Max new tokens",
            )
            seed = gr.Number(0, precision=0, minimum=0, maximum=MAX_SEED, label="Seed", elem_id="seed")
            n = gr.Slider(1, limits.max_samples, value=min(4, limits.max_samples), step=1, label="Samples")
        names = sorted(reward_functions())
        rewards = gr.CheckboxGroup(names, value=names, label="Reward functions")
        with gr.Row():
            button = gr.Button("Compare", variant="primary", elem_id="compare", scale=3)
            show_diff = gr.Checkbox(False, label="Show differences to the base", elem_id="show-diff", scale=1)
        chart = gr.BarPlot(
            x=CHART_COLUMNS[0],
            y=CHART_COLUMNS[1],
            color=CHART_COLUMNS[2],
            title="Mean reward per model",
            height=220,
            visible=False,
            elem_id="reward-chart",
        )
        with gr.Row():
            slots = [gr.HTML(visible=False, elem_id=f"column-{i}") for i in range(MAX_ADAPTERS + 1)]
        columns = gr.State()

        def handle(base_text, adapters_text, *controls):
            if public:  # what the browser sends for the model fields is ignored
                base_text, adapters_text = base, adapters
            return run_compare(base_text, adapters_text, *controls)

        inputs = [base_box, adapters_box, prompt, temperature, top_p, max_new, seed, n, rewards, show_diff]
        button.click(handle, inputs, [*slots, chart, columns], api_name="compare")
        show_diff.change(render_columns, [columns, show_diff], slots, api_name=False)
    demo.queue(default_concurrency_limit=1, max_size=limits.queue_size)
    return demo


def main(
    host: str | None = None,
    port: int | None = None,
    base_model: str | None = None,
    adapters: str | None = None,
) -> None:
    """Load the models (arguments, else environment; CompareError on a bad configuration), then serve the UI.

    host/port default to GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (set on Spaces), else 127.0.0.1:7860.
    """
    host = host or os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1")
    port = port or int(os.environ.get("GRADIO_SERVER_PORT", "7860"))
    base, adapters = default_config(base_model, adapters)
    load_bank(base, parse_adapter_specs(adapters))
    public = is_public()
    print(
        f"base model: {base}\nadapters: {adapters or '(none found; pass --adapters)'}"
        f"{' (model fields locked)' if public else ''}\nserving on http://{host}:{port}",
        flush=True,
    )
    build_demo(base, adapters, public).launch(server_name=host, server_port=port, css=CSS, quiet=True)


if __name__ == "__main__":
    main()
