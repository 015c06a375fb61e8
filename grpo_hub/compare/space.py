"""Gradio Space: completions of a base model next to those of up to four LoRA adapters.

Served by `spaces_app/app.py` (on a Space), `python -m spaces_app` or `grpo-hub compare` (locally).
Configuration (environment variables, all optional):
  GRPO_HUB_BASE_MODEL   base model id or folder (default: the offline arithmetic model of grpo_hub.tasks)
  GRPO_HUB_ADAPTERS     "owner/name@revision, ./local/folder, ..." (default: the adapters of the base
                        found in GRPO_HUB_OUTPUT_DIR, default "outputs", where the training recipes save)
  GRPO_HUB_MAX_PROMPT_CHARS, GRPO_HUB_MAX_NEW_TOKENS, GRPO_HUB_MAX_SAMPLES, GRPO_HUB_QUEUE_SIZE  caps
  HF_TOKEN              read access to private adapters
The comparison itself (loading, seeded generation, rewards, diffs) lives in bank / scoring / html.
"""

from __future__ import annotations

import logging
import os

import gradio as gr

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
from grpo_hub.compare.html import column_html
from grpo_hub.compare.scoring import compare, example_prompts, reward_functions

logger = logging.getLogger(__name__)

CSS = """
ins { background: #c9f2c9; text-decoration: none; }
del { background: #f8c9c9; }
.model-column pre { white-space: pre-wrap; word-break: break-all; margin: 0.2em 0; }
"""
INTRO = (
    "# GRPO adapters vs their base\n"
    "Every column samples the prompt with the **same seed**, so sample *i* of an adapter differs from sample "
    "*i* of the base only because of the adapter. <ins>Green</ins> text is new in the adapter, "
    "<del>red</del> text is the base's."
)


def default_config() -> tuple[str, str]:
    """(base model, adapters text) from the environment, falling back to the offline arithmetic model."""
    base = os.environ.get("GRPO_HUB_BASE_MODEL")
    if not base:
        from grpo_hub.tasks import build_arithmetic_model

        base = build_arithmetic_model()
    adapters = os.environ.get("GRPO_HUB_ADAPTERS")
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


def run_compare(base, adapters, prompt, temperature, top_p, max_new_tokens, seed, n, rewards):
    """Gradio handler: one HTML column per model (base first); unused column slots are hidden.

    Every failure reaches the page as a `gr.Error`: a CompareError with its message, anything unexpected as
    its type and message (the traceback goes to the server log).
    """
    try:
        sampling = read_sampling(temperature, top_p, max_new_tokens, seed, n)
        bank = load_bank((base or "").strip(), parse_adapter_specs(adapters))
        columns = compare(bank, prompt, sampling, list(rewards or []), Limits.from_env())
    except CompareError as error:
        raise gr.Error(str(error)) from error
    except Exception as error:
        logger.exception("compare failed")
        raise gr.Error(
            f"the comparison failed unexpectedly ({type(error).__name__}: {error}); the server log has the details"
        ) from error
    html = [column_html(column) for column in columns]
    hidden = [gr.HTML(value="", visible=False) for _ in range(MAX_ADAPTERS + 1 - len(html))]
    return [gr.HTML(value=h, visible=True) for h in html] + hidden


def build_demo(base: str, adapters: str) -> gr.Blocks:
    """The Blocks UI: models, prompt + examples, sampling controls, rewards, one column per model."""
    limits = Limits.from_env()
    with gr.Blocks(title="grpo_hub: compare adapters") as demo:
        gr.Markdown(INTRO)
        with gr.Accordion("Models", open=False):
            base_box = gr.Textbox(base, label="Base model (Hub id or folder)", elem_id="base-model")
            adapters_box = gr.Textbox(
                adapters,
                label=f"Adapters, up to {MAX_ADAPTERS}: owner/name@revision or folder, comma-separated",
                elem_id="adapters",
            )
        prompt = gr.Textbox(label="Prompt", lines=2, max_length=limits.max_prompt_chars, elem_id="prompt")
        gr.Examples(example_prompts(), inputs=prompt, label="Prompts of the built-in tasks")
        with gr.Row():
            temperature = gr.Slider(0, 2, value=1.0, step=0.05, label="Temperature (0 = greedy)")
            top_p = gr.Slider(0.05, 1, value=1.0, step=0.05, label="Top-p")
            max_new = gr.Slider(
                1, limits.max_new_tokens, value=min(32, limits.max_new_tokens), step=1, label="Max new tokens"
            )
            seed = gr.Number(0, precision=0, minimum=0, maximum=MAX_SEED, label="Seed", elem_id="seed")
            n = gr.Slider(1, limits.max_samples, value=min(4, limits.max_samples), step=1, label="Samples")
        names = sorted(reward_functions())
        rewards = gr.CheckboxGroup(names, value=names, label="Reward functions")
        button = gr.Button("Compare", variant="primary", elem_id="compare")
        with gr.Row():
            slots = [gr.HTML(visible=False, elem_id=f"column-{i}") for i in range(MAX_ADAPTERS + 1)]
        inputs = [base_box, adapters_box, prompt, temperature, top_p, max_new, seed, n, rewards]
        button.click(run_compare, inputs, slots, api_name="compare")
    demo.queue(default_concurrency_limit=1, max_size=limits.queue_size)
    return demo


def main(host: str | None = None, port: int | None = None) -> None:
    """Load the configured models (raising CompareError on a bad configuration), then serve the UI.

    host/port default to GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (set on Spaces), else 127.0.0.1:7860.
    """
    host = host or os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1")
    port = port or int(os.environ.get("GRADIO_SERVER_PORT", "7860"))
    base, adapters = default_config()
    load_bank(base, parse_adapter_specs(adapters))
    print(f"base model: {base}\nadapters: {adapters or '(none found; set GRPO_HUB_ADAPTERS)'}", flush=True)
    build_demo(base, adapters).launch(server_name=host, server_port=port, css=CSS)


if __name__ == "__main__":
    main()
