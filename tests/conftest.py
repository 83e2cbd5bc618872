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
    """A saved tiny BERT folder (weights + WordPiece tokenizer over :data:`TINY_BERT_WORDS`), built once.

    The vocabulary file goes in positionally: transformers 5 renamed ``vocab_file=`` to ``vocab=`` and ignores the
    old keyword, which left a five-token vocabulary that maps every word to ``[UNK]`` (so texts differed only in
    length). Asserted here: every word is its own token, and different texts give different ids.
    """
    d = tmp_path_factory.mktemp("tiny_bert")
    vocab = [*SPECIAL_TOKENS, *TINY_BERT_WORDS]
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = BertTokenizerFast(str(d / "vocab.txt"), do_lower_case=True)
    assert len(tok.get_vocab()) == len(vocab), len(tok.get_vocab())
    ids = tok(list(TINY_BERT_WORDS), add_special_tokens=False)["input_ids"]
    assert ids == [[vocab.index(w)] for w in TINY_BERT_WORDS], "a word of the tiny vocabulary is not its own token"
    a, b = (tok(t)["input_ids"] for t in ("a cat purrs", "a dog barks"))
    assert len(a) == len(b) and a != b
    tok.save_pretrained(str(d))
    build_tiny_bert(0, vocab_size=len(vocab), max_positions=64).save_pretrained(str(d))
    return d


@pytest.fixture(scope="session")
def small_tree() -> Taxonomy:
    """``r -> a -> {x, y}``, ``r -> b``: the five-node tree of the docstring examples."""
    return Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
