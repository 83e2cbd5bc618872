"""Tiny Hugging Face encoders shared by the tests (the fixtures in conftest.py build on these)."""

from __future__ import annotations

import torch
from transformers import BertConfig, BertModel

# The words of every synthetic text the tests feed a tiny BERT: test_models' sentences and train's
# synthetic "node{i} noise{j}" texts.
TINY_BERT_WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "car",
    "bike",
    "purrs",
    "barks",
    "drives",
    "fast",
    "slow",
    "on",
    "road",
    "sea",
    "boat",
    "sails",
    ".",
    *(f"node{i}" for i in range(12)),
    *(f"noise{i}" for i in range(50)),
    *(",", "animal", "vehicle"),  # the rest of the words the text-model tests feed it (tests/conftest.py checks)
]
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_tiny_bert(seed: int = 0, attn: str = "eager", vocab_size: int = 64, max_positions: int = 32) -> BertModel:
    """A random 3-layer BERT (hidden 32, no dropout) in eval mode; the same ``seed`` gives the same weights."""
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_positions,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    cfg._attn_implementation = attn
    return BertModel(cfg).eval()
