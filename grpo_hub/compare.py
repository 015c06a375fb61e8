"""Compare completions of a base model and up to four LoRA adapters on one prompt (no gradio needed).

```python
from grpo_hub.compare import Sampling, load_bank, compare
bank = load_bank("path/to/base", ("outputs/run-a", "user/adapter@v1"))
columns = compare(bank, "Repeat the letter k: k", Sampling(n=4, seed=0), ["letter_fraction_reward"])
```

Design
- One base model, adapters loaded as named PEFT adapters on one `PeftModel` and switched with
  `set_adapter` (the base column runs under `disable_adapter()`). The base weights are held once; an
  adapter adds only its LoRA matrices, so four adapters cost little more memory than one. Switching
  mutates shared state, so every generation holds the bank's lock.
- Each column is one `generate` call with `num_return_sequences=n`, after `torch.manual_seed(seed)`:
  with the same seed, sample i of every column starts from the same random state, so differences
  between columns come from the adapter and sample i of an adapter is diffed against sample i of the base.
- Rewards are the built-in task reward functions. Those that read a dataset column (the letter task's
  `letter`) get it from the task's own prompt rows; for any other prompt they are reported as missing.
- `trust_remote_code` is never passed; prompt length, new tokens and samples are capped (`Limits`).
"""

from __future__ import annotations

import difflib
import functools
import html
import inspect
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

MAX_ADAPTERS = 4
BASE_LABEL = "base"
_TRL_ARGS = {"prompts", "completions"}


class CompareError(ValueError):
    """A problem the user can fix; the message names what is wrong and how to fix it."""


def _env_int(name: str, default: int) -> int:
    """Positive integer from environment variable `name`, else `default`."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if not raw.strip().isdigit() or int(raw) < 1:
        raise CompareError(f"{name}={raw!r} must be a positive integer; unset it to use {default}")
    return int(raw)


@dataclass(frozen=True)
class Limits:
    """Caps that protect a shared Space; each can be set by the environment variable in `from_env`."""

    max_prompt_chars: int = 2000
    max_new_tokens: int = 256
    max_samples: int = 8
    queue_size: int = 32

    @classmethod
    def from_env(cls) -> Limits:
        """Read GRPO_HUB_MAX_PROMPT_CHARS, _MAX_NEW_TOKENS, _MAX_SAMPLES and _QUEUE_SIZE."""
        return cls(
            max_prompt_chars=_env_int("GRPO_HUB_MAX_PROMPT_CHARS", cls.max_prompt_chars),
            max_new_tokens=_env_int("GRPO_HUB_MAX_NEW_TOKENS", cls.max_new_tokens),
            max_samples=_env_int("GRPO_HUB_MAX_SAMPLES", cls.max_samples),
            queue_size=_env_int("GRPO_HUB_QUEUE_SIZE", cls.queue_size),
        )


@dataclass(frozen=True)
class Sampling:
    """Sampling controls shared by every column. temperature 0 means greedy decoding."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    seed: int = 0
    n: int = 4

    def check(self, limits: Limits) -> None:
        """Raise CompareError naming the first control outside its range."""
        if not 0 <= self.temperature <= 5:
            raise CompareError(f"temperature {self.temperature} is outside [0, 5]; 0 means greedy")
        if not 0 < self.top_p <= 1:
            raise CompareError(f"top-p {self.top_p} is outside (0, 1]")
        if not 1 <= self.max_new_tokens <= limits.max_new_tokens:
            raise CompareError(
                f"max new tokens {self.max_new_tokens} is outside [1, {limits.max_new_tokens}] "
                "(raise the cap with GRPO_HUB_MAX_NEW_TOKENS)"
            )
        if not 1 <= self.n <= limits.max_samples:
            raise CompareError(
                f"n samples {self.n} is outside [1, {limits.max_samples}] (raise the cap with GRPO_HUB_MAX_SAMPLES)"
            )
        if self.seed < 0:
            raise CompareError(f"seed {self.seed} must be >= 0")


def parse_adapter_specs(text: str | None) -> tuple[str, ...]:
    """Split "a@rev, ./local, b" into specs (commas or newlines); at most MAX_ADAPTERS, no duplicates."""
    specs = tuple(s.strip() for s in re.split(r"[,\n]", text or "") if s.strip())
    if len(specs) > MAX_ADAPTERS:
        raise CompareError(
            f"{len(specs)} adapters given; the Space compares at most {MAX_ADAPTERS}: drop some"
        )
    duplicates = sorted({s for s in specs if specs.count(s) > 1})
    if duplicates:
        raise CompareError(f"adapter(s) {duplicates} listed twice: list each once")
    return specs


def discover_adapters(root: str | os.PathLike, base_model: str) -> tuple[str, ...]:
    """Adapters of `base_model` at `root` or one level below (training outputs), newest first, at most 4.

    Checkpoint folders, TRL's `ref/` reference adapter and adapters of another base are skipped.
    """
    root = Path(root)
    if not root.is_dir():
        return ()
    candidates = [root, *(p for p in root.iterdir() if p.is_dir())]
    found = [
        p
        for p in candidates
        if (p / "adapter_config.json").is_file()
        and p.name != "ref"
        and not p.name.startswith("checkpoint-")
        and _trained_on(p, base_model)
    ]
    found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return tuple(str(p) for p in found[:MAX_ADAPTERS])


def _looks_local(spec: str) -> bool:
    """True for specs that can only mean a folder: absolute, ./ or ../ or ~ paths."""
    return spec.startswith(("/", "./", "../", "~", "\\")) or os.path.exists(os.path.expanduser(spec))


def resolve_adapter(spec: str) -> str:
    """Local folder of adapter `spec`: a folder path, or "owner/name[@revision]" pulled from the Hub (HF_TOKEN)."""
    if _looks_local(spec):
        folder = Path(spec).expanduser()
        if not folder.is_dir():
            raise CompareError(
                f"adapter {spec!r} not found: no such folder. Give a local adapter folder or 'owner/name@rev'"
            )
        if not (folder / "adapter_config.json").is_file():
            raise CompareError(
                f"adapter {spec!r} holds no adapter_config.json: point to the folder the trainer saved the adapter in"
            )
        return str(folder)
    from grpo_hub.hub import download_adapter  # lazy: only Hub specs need the hub module

    try:
        return str(download_adapter(spec).adapter_dir)
    except Exception as error:  # HubError / ValueError already say why and how to fix it
        raise CompareError(f"unknown adapter {spec!r}: {error}") from error


def _model_name(name_or_path: str) -> str:
    """Comparable name of a model: its resolved folder name if local, else the last part of the Hub id."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path.resolve().name
    return name_or_path.rstrip("/").split("/")[-1]


def _base_of(adapter_dir: str | os.PathLike) -> str | None:
    """The base model an adapter folder names in adapter_config.json (None if it names none)."""
    return json.loads((Path(adapter_dir) / "adapter_config.json").read_text()).get("base_model_name_or_path")


def _trained_on(adapter_dir: str | os.PathLike, base_model: str) -> bool:
    """Whether the adapter's recorded base has the same name as `base_model` (True if none is recorded).

    Names are compared, so a Hub id and a local copy in a folder of the same name match.
    """
    trained_on = _base_of(adapter_dir)
    return not trained_on or _model_name(trained_on) == _model_name(base_model)


def check_base_match(adapter_dir: str, base_model: str, spec: str) -> None:
    """Raise CompareError when adapter `spec` (in `adapter_dir`) was trained on another base than `base_model`."""
    if not _trained_on(adapter_dir, base_model):
        trained_on = _base_of(adapter_dir)
        raise CompareError(
            f"adapter {spec!r} was trained on base {trained_on!r}, not on {base_model!r}: "
            f"set the base model to {trained_on!r} or compare adapters of {base_model!r}"
        )


def _is_out_of_memory(error: BaseException) -> bool:
    """True for accelerator OOM (torch.OutOfMemoryError), MemoryError and the CPU allocator's failure."""
    import torch

    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(error)


class ModelBank:
    """The base model and its adapters, loaded once; `generate` runs one column at a time under a lock."""

    def __init__(self, base_model: str, adapter_specs: tuple[str, ...]):
        """Load the base (never trust_remote_code), then each adapter as a named PEFT adapter on it."""
        if len(adapter_specs) > MAX_ADAPTERS:
            raise CompareError(f"{len(adapter_specs)} adapters given; at most {MAX_ADAPTERS}: drop some")
        self.base_model = base_model
        self.labels = (BASE_LABEL, *adapter_specs)
        self._lock = threading.Lock()
        model, self.tokenizer = self._load_base(base_model)
        folders = [resolve_adapter(spec) for spec in adapter_specs]
        for spec, folder in zip(adapter_specs, folders, strict=True):
            check_base_match(folder, base_model, spec)
        for index, folder in enumerate(folders):
            model = self._add_adapter(model, index, folder)
        self.model = model.eval()

    @staticmethod
    def _load_base(base_model: str):
        """(model, tokenizer) of `base_model`; a folder or id that holds no model is a CompareError."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            model = AutoModelForCausalLM.from_pretrained(base_model, trust_remote_code=False)
            tokenizer = AutoTokenizer.from_pretrained(base_model, trust_remote_code=False)
        except (OSError, ValueError) as error:
            raise CompareError(
                f"cannot load base model {base_model!r}: {error}. Give a causal LM folder or Hub id"
            ) from error
        return model, tokenizer

    def _add_adapter(self, model, index: int, folder: str):
        """Load the adapter in `folder` as "adapter<index>" (PEFT names become module keys: no '/', '.', '@')."""
        from peft import PeftModel

        name = f"adapter{index}"
        try:
            if index == 0:
                return PeftModel.from_pretrained(model, folder, adapter_name=name)
            model.load_adapter(folder, adapter_name=name)
            return model
        except (RuntimeError, ValueError, KeyError) as error:
            raise CompareError(
                f"adapter {self.labels[index + 1]!r} does not fit base {self.base_model!r}: {error}"
            ) from error

    def generate(self, column: int, prompt: str, sampling: Sampling) -> list[str]:
        """`sampling.n` completions of `prompt` by column `column` (0 = base), seeded with `sampling.seed`."""
        import torch

        inputs = self.tokenizer(prompt, return_tensors="pt")
        options = {"do_sample": sampling.temperature > 0, "max_new_tokens": sampling.max_new_tokens}
        if sampling.temperature > 0:
            options |= {"temperature": sampling.temperature, "top_p": sampling.top_p}
        with self._lock, torch.inference_mode():
            torch.manual_seed(sampling.seed)
            try:
                if column == 0:
                    output = self._generate_base(inputs, sampling.n, options)
                else:
                    self.model.set_adapter(f"adapter{column - 1}")
                    output = self._call_generate(inputs, sampling.n, options)
            except (RuntimeError, MemoryError) as error:
                if not _is_out_of_memory(error):
                    raise
                raise CompareError(
                    f"out of memory generating for {self.labels[column]!r}: lower n samples or max new tokens"
                ) from error
        new_tokens = output[:, inputs["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)

    def _generate_base(self, inputs, n: int, options: dict):
        """Generate with every adapter switched off (a bank without adapters is a plain model)."""
        if len(self.labels) == 1:
            return self._call_generate(inputs, n, options)
        with self.model.disable_adapter():
            return self._call_generate(inputs, n, options)

    def _call_generate(self, inputs, n: int, options: dict):
        """One batched `generate` call returning `n` sequences."""
        pad = self.tokenizer.pad_token_id
        pad = self.tokenizer.eos_token_id if pad is None else pad
        return self.model.generate(**inputs, num_return_sequences=n, pad_token_id=pad, **options)


@functools.lru_cache(maxsize=1)
def load_bank(base_model: str, adapter_specs: tuple[str, ...]) -> ModelBank:
    """The cached ModelBank for this base + adapters; loading another set replaces it (one set in memory)."""
    return ModelBank(base_model, adapter_specs)


def reward_functions() -> dict:
    """Built-in reward functions usable on free text, by name: those of the offline tasks."""
    from grpo_hub.tasks import OFFLINE_TASKS, get_reward_funcs

    return {fn.__name__: (task, fn) for task in OFFLINE_TASKS for fn in get_reward_funcs(task)}


@functools.lru_cache(maxsize=4)
def task_rows(task: str) -> dict[str, dict]:
    """The task's prompt rows by prompt text: 512 rows at seed 0, to find the columns a reward reads."""
    from grpo_hub.tasks import load_task_dataset

    return {row["prompt"]: row for row in load_task_dataset(task, n=512, seed=0)}


def example_prompts(per_task: int = 3) -> list[str]:
    """A few distinct prompts of each offline task, for the Space's examples."""
    from grpo_hub.tasks import OFFLINE_TASKS

    return [prompt for task in OFFLINE_TASKS for prompt in list(task_rows(task))[:per_task]]


def _needed_columns(fn) -> list[str]:
    """Dataset columns a TRL reward function requires besides prompts and completions."""
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.name not in _TRL_ARGS and p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty
    ]


def score(reward_names: list[str], prompt: str, completions: list[str]) -> dict[str, list[float] | None]:
    """Each named reward of each completion; None for a reward whose dataset column this prompt lacks."""
    available = reward_functions()
    unknown = [name for name in reward_names if name not in available]
    if unknown:
        raise CompareError(f"unknown reward function(s) {unknown}: choose from {sorted(available)}")
    scores = {}
    for name in reward_names:
        task, fn = available[name]
        row = task_rows(task).get(prompt, {})
        needed = _needed_columns(fn)
        if any(column not in row for column in needed):
            scores[name] = None
            continue
        columns = {column: [row[column]] * len(completions) for column in needed}
        scores[name] = [float(r) for r in fn([prompt] * len(completions), completions, **columns)]
    return scores


def diff_segments(base: str, other: str) -> list[tuple[str, str | None]]:
    """Word-level diff of `other` against `base`: (text, None | "+" added in other | "-" only in base)."""
    a, b = re.split(r"(\s+)", base), re.split(r"(\s+)", other)
    segments = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            segments.append(("".join(a[i1:i2]), None))
            continue
        if i2 > i1:
            segments.append(("".join(a[i1:i2]), "-"))
        if j2 > j1:
            segments.append(("".join(b[j1:j2]), "+"))
    return [(text, label) for text, label in segments if text]


@dataclass
class Column:
    """One model's completions, their rewards (per reward function) and their diffs against the base."""

    label: str
    completions: list[str]
    rewards: dict[str, list[float] | None]
    diffs: list[list[tuple[str, str | None]]] | None = None

    def mean_reward(self, name: str) -> float | None:
        """Mean of reward `name` over the completions, None if the reward could not be computed."""
        values = self.rewards.get(name)
        return sum(values) / len(values) if values else None


def compare(
    bank: ModelBank, prompt: str, sampling: Sampling, reward_names: list[str], limits: Limits | None = None
) -> list[Column]:
    """Generate, score and diff every column of `bank` for `prompt` (column 0 is the base)."""
    limits = limits or Limits()
    if not prompt or not prompt.strip():
        raise CompareError("the prompt is empty: type a prompt or pick an example")
    if len(prompt) > limits.max_prompt_chars:
        raise CompareError(
            f"the prompt has {len(prompt)} characters; the limit is {limits.max_prompt_chars} "
            "(shorten it or raise GRPO_HUB_MAX_PROMPT_CHARS)"
        )
    sampling.check(limits)
    columns = []
    for index, label in enumerate(bank.labels):
        completions = bank.generate(index, prompt, sampling)
        columns.append(Column(label, completions, score(reward_names, prompt, completions)))
    for column in columns[1:]:
        column.diffs = [
            diff_segments(b, o) for b, o in zip(columns[0].completions, column.completions, strict=True)
        ]
    return columns


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
