"""Tiny randomly initialised Hugging Face models that tests build and save themselves.

No weights are downloaded: a BERT with 32 hidden units and a WordPiece tokenizer over the
vocabulary the test gives, saved as an ordinary model folder (``config.json``, weights,
tokenizer files), for architecture tests of the loaders.

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp()) / "bert"
>>> tiny_bert(folder, [*SPECIAL, "wing", "lift"], seed=0)
>>> (folder / "config.json").exists(), (folder / "tokenizer_config.json").exists()
(True, True)
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Sequence

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""The special tokens every tiny vocabulary starts with (BERT's)."""


def tiny_bert(folder: str | os.PathLike, vocab: Sequence[str], *, seed: int | None = None,
              layers: int = 2) -> None:
    """Save a random BERT (hidden size 32, ``layers`` layers, 2 heads, 128 positions) and a
    lower-casing WordPiece tokenizer over ``vocab`` (one entry per token, in id order) into
    ``folder``; ``seed`` seeds torch first (None: the caller's generator state). A token listed
    twice is refused: the tokenizer would number the later entry past the model's vocabulary."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    twice = sorted({w for w in vocab if vocab.count(w) > 1})
    if twice:
        raise ValueError(f"tiny_bert: tokens listed more than once in vocab: {twice}")
    if seed is not None:
        torch.manual_seed(seed)
    os.makedirs(folder, exist_ok=True)
    if "vocab" in inspect.signature(BertTokenizerFast.__init__).parameters:  # transformers 5
        tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    else:
        vocab_file = os.path.join(folder, "vocab.txt")
        with open(vocab_file, "w", encoding="utf-8") as f:
            f.write("\n".join(vocab) + "\n")
        tok = BertTokenizerFast(vocab_file=vocab_file, do_lower_case=True)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=layers,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
