"""A hiercls model trained by ``transformers.Trainer``, unchanged, and scored with hiercls's torchmetrics metric.

A tiny BERT and its WordPiece vocabulary are built here from the words of the data (offline: nothing is
downloaded); :func:`hiercls.models.create_model` puts a hierarchical head on it, and
:class:`hiercls.models.hf.HierclsModel` makes it a ``PreTrainedModel`` whose ``forward(**batch, labels=...)``
returns the head's loss and the node probabilities. After training, ``Trainer.predict`` gives the node
probabilities, a decoder turns them into nodes and :class:`hiercls.metrics.HierarchicalMetrics` scores them.

Run: ``python examples/hf_trainer.py`` (a few seconds on a CPU).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    BertConfig,
    BertModel,
    BertTokenizerFast,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
)

from hiercls.decode import parse_decoder
from hiercls.metrics import HierarchicalMetrics
from hiercls.models import HierarchicalClassifier, create_model
from hiercls.models.hf import HierclsModel
from hiercls.taxonomy import Taxonomy

EDGES = [
    ("root", "animal"),
    ("animal", "cat"),
    ("animal", "dog"),
    ("root", "vehicle"),
    ("vehicle", "car"),
    ("vehicle", "boat"),
]
DATA = [
    ("the cat purrs", "cat"),
    ("a cat sleeps", "cat"),
    ("the dog barks", "dog"),
    ("a dog runs fast", "dog"),
    ("the car drives on the road", "car"),
    ("a fast car", "car"),
    ("the boat sails", "boat"),
    ("a boat on the sea", "boat"),
]


def taxonomy() -> Taxonomy:
    return Taxonomy(EDGES, name="animals-vehicles")


def build_tiny_bert(folder: Path, seed: int = 0) -> Path:
    """A random 2-layer BERT (hidden 32, no dropout) and a WordPiece tokenizer over the data's words."""
    words = sorted({w for text, _ in DATA for w in text.split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(str(folder))
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    BertModel(cfg).save_pretrained(str(folder))
    return folder


def build_model(bert: Path, head: str = "conditional_softmax", seed: int = 0) -> HierarchicalClassifier:
    """The hiercls model (same ``seed``: same head weights)."""
    torch.manual_seed(seed)
    return create_model(f"hf:{bert}", taxonomy(), head=head, max_length=16)


class TextSet(torch.utils.data.Dataset):
    """Tokenised texts with node-id labels, as ``Trainer`` and ``DataCollatorWithPadding`` expect them."""

    def __init__(self, model: HierarchicalClassifier) -> None:
        tok = model.backbone.tokenizer
        self.items = [
            {**tok(text, truncation=True, max_length=16), "labels": model.taxonomy.index(label)} for text, label in DATA
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


def main(
    steps: int = 4,
    lr: float = 0.5,
    seed: int = 0,
    head: str = "conditional_softmax",
    decoder: str = "argmax_leaf",
    out_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Train ``steps`` full-batch SGD steps with ``Trainer``, then score ``decoder``'s predictions.

    Returns:
        ``{"metrics": HierarchicalMetrics results, "model": the trained HierarchicalClassifier,
        "node_probs": Trainer.predict's node probabilities}``; with ``out_dir`` the model is also saved there
        (hiercls's files, model card with the metrics) and loads back with ``AutoModel.from_pretrained``.
    """
    work = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="hiercls_hf_trainer_"))
    model = build_model(build_tiny_bert(work / "tiny_bert", seed), head, seed)
    data = TextSet(model)
    args = TrainingArguments(
        output_dir=str(work / "trainer"),
        per_device_train_batch_size=len(data),  # full batches: the sampler's order cannot change the steps
        per_device_eval_batch_size=4,
        max_steps=steps,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=0.0,  # no clipping
        optim="sgd",  # plain SGD: the steps are reproducible to float rounding
        seed=seed,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    hf_model = HierclsModel.from_hiercls(model)
    trainer = Trainer(
        model=hf_model,
        args=args,
        train_dataset=data,
        data_collator=DataCollatorWithPadding(model.backbone.tokenizer),
    )
    trainer.train()
    predictions = trainer.predict(data).predictions
    probs = predictions[-1] if isinstance(predictions, tuple) else predictions  # (logits, node_probs)
    labels = np.array([item["labels"] for item in data.items])
    metric = HierarchicalMetrics(model.taxonomy, k=(1,))
    metric.update(parse_decoder(decoder)(probs, model.taxonomy), labels, y_score=probs)
    results = metric.results()
    if out_dir is not None:
        hf_model.save_pretrained(work / "model", metrics={f"{decoder}/{k}": v for k, v in results.items()})
    return {"metrics": results, "model": model, "node_probs": probs}


if __name__ == "__main__":
    out = main()
    print({k: v for k, v in out["metrics"].items() if k in ("accuracy", "hF1_micro", "mistake_severity")})
