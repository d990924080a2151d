"""A word-level tokenizer with a Qwen-style chat template, written offline (no download).

What the tiny Qwen3-MoE checkpoints of the CPU tests and of ``make verl-smoke`` load as their
tokenizer: verl's ``HFModelConfig`` and ``RLHFDataset`` need a tokenizer with a chat template.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")


def write_word_tokenizer(out: Path, words: Iterable[str]) -> int:
    """Save a tokenizer over ``SPECIALS`` + the distinct ``words`` in ``out``; returns its vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(list(SPECIALS) + sorted(set(words)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="[UNK]")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(vocab)
