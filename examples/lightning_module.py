"""A LightningModule with a hiercls head, its loss, a decoder and the torchmetrics metric, on a CPU.

The head (:func:`hiercls.heads.create_head`) sits on a small encoder; ``training_step`` returns the head's loss,
``validation_step`` decodes the node probabilities (:func:`hiercls.decode.parse_decoder`), updates
``HierarchicalMetrics.collection(...)``, a ``torchmetrics.MetricCollection`` of one
:class:`hiercls.metrics.HierarchicalMetrics` per result (``val/hF1_micro``, ``val/per_level_accuracy/1``, ...;
its members share one state, so one update per batch), and hands the collection to ``self.log_dict``, as any
torchmetrics collection: Lightning computes it at the end of the epoch (the sums all-reduced across DDP ranks)
and resets it. The collection is a submodule, so it moves with the module to its device. On a large taxonomy
build fewer members with ``outputs=["hF1_micro", "accuracy", ...]`` (each member allocates its own states).

Run: ``python examples/lightning_module.py`` (a few seconds on a CPU).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch
from torch import nn

from hiercls.decode import parse_decoder
from hiercls.heads import create_head
from hiercls.metrics import HierarchicalMetrics
from hiercls.taxonomy import Taxonomy

EDGES = [
    ("root", "animal"),
    ("animal", "cat"),
    ("animal", "dog"),
    ("animal", "bird"),
    ("root", "vehicle"),
    ("vehicle", "car"),
    ("vehicle", "boat"),
]


def taxonomy() -> Taxonomy:
    return Taxonomy(EDGES, name="animals-vehicles")


def make_data(tax: Taxonomy, n: int, dim: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Features around one random centre per leaf (siblings' centres close), labels = leaf node ids."""
    rng = np.random.default_rng(seed)
    leaves = np.asarray(tax.leaves)
    parents = {int(p) for leaf in leaves for p in tax.parents(int(leaf))}
    parent_centre = {p: rng.normal(0, 2, dim) for p in sorted(parents)}
    centre = {int(leaf): parent_centre[tax.parents(int(leaf))[0]] + rng.normal(0, 1, dim) for leaf in leaves}
    y = rng.choice(leaves, n)
    x = np.stack([centre[int(v)] for v in y]) + rng.normal(0, 0.7, (n, dim))
    return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.long)


class HierarchicalLitModule(L.LightningModule):
    """Encoder + hiercls head; hierarchical metrics of one decoder on the validation set."""

    def __init__(
        self,
        tax: Taxonomy,
        in_features: int = 8,
        head: str = "conditional_softmax",
        decoder: str = "argmax_leaf",
        lr: float = 0.2,
    ) -> None:
        super().__init__()
        self.taxonomy = tax
        self.encoder = nn.Sequential(nn.Linear(in_features, 16), nn.Tanh())
        self.head = create_head(head, tax, 16)
        self.decoder = parse_decoder(decoder)
        self.lr = lr
        self.val_metrics = HierarchicalMetrics.collection(tax, k=(1, 2), prefix="val/")

    def forward(self, x: torch.Tensor) -> Any:
        return self.head(self.encoder(x))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.head.loss(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        probs = self.head.node_probs(self(x))
        self.val_metrics.update(self.decoder(probs, self.taxonomy), y, y_score=probs)  # preds, target
        # The collection itself, not its values: Lightning computes it once at the epoch's end and resets it.
        self.log_dict(self.val_metrics)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def main(
    steps: int = 6,
    batch_size: int = 8,
    seed: int = 0,
    head: str = "conditional_softmax",
    decoder: str = "argmax_leaf",
    n_train: int = 24,
    n_val: int = 16,
) -> dict[str, Any]:
    """Fit ``steps`` SGD steps with ``lightning.Trainer`` (CPU), then validate.

    Returns:
        ``{"metrics": the logged validation values (floats), "module": the trained module}``.
    """
    tax = taxonomy()
    x, y = make_data(tax, n_train + n_val, seed=seed)
    train = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x[:n_train], y[:n_train]), batch_size=batch_size, shuffle=False
    )
    val = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x[n_train:], y[n_train:]), batch_size=batch_size, shuffle=False
    )
    torch.manual_seed(seed)
    module = HierarchicalLitModule(tax, x.shape[1], head=head, decoder=decoder)
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, train)  # no val loader here: validation runs once, after fit
    logged = trainer.validate(module, val, verbose=False)[0]
    return {"metrics": {k: float(v) for k, v in logged.items()}, "module": module}


if __name__ == "__main__":
    out = main()
    print({k: round(v, 4) for k, v in out["metrics"].items() if k in ("val/accuracy", "val/hF1_micro")})
