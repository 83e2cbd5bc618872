"""Shared fixtures: the saved tiny BERT and the small taxonomy of the docstring examples.

In-memory tiny BERTs come from ``tests/_tiny.py``, random trees and posteriors from ``tests/_generators.py``
(plain functions).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _tiny import SPECIAL_TOKENS, TINY_BERT_WORDS, build_tiny_bert
from transformers import BertTokenizerFast

from hiercls.taxonomy import Taxonomy


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny BERT folder (weights + WordPiece tokenizer over :data:`TINY_BERT_WORDS`), built once."""
    d = tmp_path_factory.mktemp("tiny_bert")
    vocab = [*SPECIAL_TOKENS, *TINY_BERT_WORDS]
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizerFast(vocab=str(d / "vocab.txt"), do_lower_case=True).save_pretrained(str(d))
    build_tiny_bert(0, vocab_size=len(vocab), max_positions=64).save_pretrained(str(d))
    return d


@pytest.fixture(scope="session")
def small_tree() -> Taxonomy:
    """``r -> a -> {x, y}``, ``r -> b``: the five-node tree of the docstring examples."""
    return Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
