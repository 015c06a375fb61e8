"""The models of a comparison: one base and up to four LoRA adapters on one `PeftModel`, and the caps.

Adapters are loaded as named PEFT adapters and switched with `set_adapter` (the base column runs under
`disable_adapter()`): the base weights are held once, an adapter adds only its LoRA matrices. Switching
mutates shared state, so every generation holds the bank's lock. Each column is one `generate` call with
`num_return_sequences=n` after `torch.manual_seed(seed)`, so sample i of every column starts from the same
random state. `trust_remote_code` is never passed; prompt length, new tokens and samples are capped (`Limits`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from grpo_hub.training.reference import REF_ADAPTER

MAX_ADAPTERS = 4
MAX_SEED = 2**32 - 1  # torch.manual_seed overflows above 2**64 - 1; numpy's seeds stop at 2**32 - 1


BASE_LABEL = "base"


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
        if not 0 <= self.seed <= MAX_SEED:
            raise CompareError(f"seed {self.seed} is outside [0, {MAX_SEED}]")


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
        and p.name != REF_ADAPTER
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


def provenance(spec: str, folder: str) -> dict:
    """What is known about adapter `spec` (loaded from `folder`): the commit it was pinned to and its link
    (Hub specs: the HF cache names the snapshot folder after the commit), training step and loss variant
    (from the saved run record, grpo_hub.records.run_record)."""
    from grpo_hub.records.run_record import read_run_record

    record = read_run_record(folder)
    info = {"step": record.get("step"), "variant": record.get("loss_variant")}
    sha = Path(folder).name
    if not _looks_local(spec) and re.fullmatch(r"[0-9a-f]{40}", sha):
        from huggingface_hub import constants

        repo_id = spec.partition("@")[0]
        info |= {"commit": sha, "url": f"{constants.ENDPOINT}/{repo_id}/commit/{sha}"}
    return {k: v for k, v in info.items() if v is not None}


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
        self.provenance = ({}, *(provenance(s, f) for s, f in zip(adapter_specs, folders, strict=True)))
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
