"""Pick the files of the trained LoRA adapter out of a trainer output or checkpoint folder.

`trainer.save_model()` on a PeftModel writes the "default" adapter at the folder root and every other
adapter (TRL's reference adapter "ref") in a subfolder named after it; a checkpoint adds optimizer,
scheduler and rng state. Only the trained adapter's weights and config, plus tokenizer files, are selected.
When one safetensors file holds several named adapters (keys like `...lora_A.ref.weight`), the trained
adapter's tensors are kept and renamed to PEFT's saved form (`...lora_A.weight`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from grpo_hub.training.reference import REF_ADAPTER

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
# PEFT module segments followed by the adapter name in an unsaved (named) state dict.
_NAMED_SEGMENT = re.compile(
    r"\.(lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector|modules_to_save)\.([^.]+)(?=\.|$)"
)


def adapter_names_in(keys) -> set[str]:
    """Adapter names embedded in safetensors keys; empty for PEFT's saved single-adapter form."""
    return {
        m.group(2)
        for key in keys
        for m in [_NAMED_SEGMENT.search(key)]
        if m and m.group(2) not in ("weight", "bias")
    }


def select_adapter_tensors(tensors: dict, adapter_name: str) -> dict:
    """Tensors of `adapter_name` only, renamed to PEFT's saved form (adapter name dropped)."""
    selected = {}
    for key, value in tensors.items():
        match = _NAMED_SEGMENT.search(key)
        if match is None or match.group(2) != adapter_name:
            continue
        segment = "" if match.group(1) == "modules_to_save" else f".{match.group(1)}"
        selected[key[: match.start()] + segment + key[match.end() :]] = value
    return selected


def _weights_bytes(path: Path, adapter_name: str) -> bytes | Path:
    """The weights file unchanged, or re-serialised with only `adapter_name` when it holds several adapters."""
    from safetensors import safe_open
    from safetensors.torch import save

    with safe_open(str(path), framework="pt") as handle:
        keys, metadata = list(handle.keys()), handle.metadata()
        names = adapter_names_in(keys)
        if not names:
            return path
        if adapter_name not in names:
            raise ValueError(
                f"{path} holds the adapters {sorted(names)} but none named {adapter_name!r}. "
                f"Fix: pass `adapter_name=` one of {sorted(names - {REF_ADAPTER})}."
            )
        tensors = select_adapter_tensors({k: handle.get_tensor(k) for k in keys}, adapter_name)
    return save(tensors, metadata=metadata)


def adapter_source(folder: str | Path, adapter_name: str = "default") -> Path:
    """Folder holding the trained adapter's files (cheap checks only); ValueError naming what is missing."""
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(
            f"{folder} is not a folder. Fix: pass the trainer's output_dir or one of its checkpoint-<N> folders."
        )
    if adapter_name == REF_ADAPTER:
        raise ValueError(
            "adapter_name='ref' is TRL's frozen reference adapter, not a trained one. Fix: drop adapter_name."
        )
    source = root if adapter_name == "default" else root / adapter_name
    if not (source / ADAPTER_WEIGHTS).is_file() or not (source / ADAPTER_CONFIG).is_file():
        hint = (
            "it holds a .bin adapter: save with safe_serialization=True"
            if (source / "adapter_model.bin").is_file()
            else ""
        )
        found = sorted(p.name for p in source.iterdir()) if source.is_dir() else []
        raise ValueError(
            f"{source} holds no {ADAPTER_CONFIG} + {ADAPTER_WEIGHTS} (found: {found or 'nothing'}). "
            f"Fix: pass the folder trainer.save_model() or a checkpoint wrote for a LoRA model{'; ' + hint if hint else ''}."
        )
    return source


def trained_adapter_files(
    folder: str | Path, *, adapter_name: str = "default", base_model: str | None = None
) -> dict[str, bytes | Path]:
    """Map repo path -> content (bytes or a file path) for the trained adapter and tokenizer in `folder`.

    `base_model`, when given, replaces `base_model_name_or_path` in the pushed adapter config.
    """
    root, source = Path(folder), adapter_source(folder, adapter_name)
    files: dict[str, bytes | Path] = {
        ADAPTER_CONFIG: source / ADAPTER_CONFIG,
        ADAPTER_WEIGHTS: _weights_bytes(source / ADAPTER_WEIGHTS, adapter_name),
    }
    if base_model:
        config = json.loads((source / ADAPTER_CONFIG).read_text())
        config["base_model_name_or_path"] = base_model
        files[ADAPTER_CONFIG] = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
    for name in TOKENIZER_FILES:
        if (root / name).is_file():
            files[name] = root / name
    return files
