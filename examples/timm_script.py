"""A hiercls model inside a timm-style training script (the pieces timm's ``train.py`` uses).

The model is built from a timm model object, so a timm script only swaps its loss for ``model.loss`` and decodes
``model.node_probs`` before scoring. ``resolve_model_data_config``, ``create_optimizer_v2``,
``set_grad_checkpointing``, ``ModelEmaV3`` and ``AverageMeter`` work unchanged. Run it:
``python examples/timm_script.py``; ``tests/test_examples_loops.py`` checks that it reaches the same weights and
metrics as ``hiercls train`` with the recipe of ``examples/plain_loop.py``.
"""

from __future__ import annotations

import random

import numpy as np
import timm
import torch
from timm.data import resolve_model_data_config
from timm.optim import create_optimizer_v2
from timm.utils import AverageMeter, ModelEmaV3

from hiercls.data import build_dataset
from hiercls.decode import decode
from hiercls.metrics import hierarchical_f1_score, hierarchical_precision_score
from hiercls.models import create_model
from hiercls.taxonomy import Taxonomy

EDGES = [("root", c) for c in "ab"] + [(p, f"{p}{i}") for p in "ab" for i in range(3)]


def main(seed: int = 0, epochs: int = 2, samples: int = 24) -> tuple[dict[str, float], torch.nn.Module]:
    """Train as a timm script would, decode for hF1 and score; returns ``(metrics, model)``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tax = Taxonomy(EDGES, name="toy")
    model = create_model(timm.create_model("test_vit", img_size=16, num_classes=0), tax, head="semantic_softmax")
    data_config = resolve_model_data_config(model)  # what timm's loaders and transforms are built from
    model.set_grad_checkpointing(True)  # timm's --grad-checkpointing
    options = {"kind": "image", "train_samples": samples, "val_samples": samples // 2}
    train_set = build_dataset("synthetic", "train", tax, options)
    val_set = build_dataset("synthetic", "val", tax, options)
    assert tuple(train_set[0][0].shape) == tuple(data_config["input_size"])
    loader = torch.utils.data.DataLoader(train_set, batch_size=8, collate_fn=model.collate)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=3e-3, weight_decay=0.0)
    model_ema = ModelEmaV3(model, decay=0.99)
    train_loss_fn = model.loss  # in place of timm's CrossEntropy: node-id targets, -1 = ignore
    losses = AverageMeter()
    model.train()
    for _ in range(epochs):
        for images, target in loader:
            loss = train_loss_fn(model(images), target)
            losses.update(loss.item(), images.size(0))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            model_ema.update(model)
    model.eval()
    val = torch.utils.data.DataLoader(val_set, batch_size=8, collate_fn=model.collate)
    with torch.no_grad():
        pairs = [(model.node_probs(model(x)), y) for x, y in val]
    probs, labels = torch.cat([p for p, _ in pairs]), torch.cat([y for _, y in pairs])
    sets = decode(probs, tax, "optimal_hfbeta")
    metrics = {
        "hF1_micro": float(hierarchical_f1_score(labels, sets, taxonomy=tax)),
        "hP_micro": float(hierarchical_precision_score(labels, sets, taxonomy=tax)),
    }
    return metrics, model


if __name__ == "__main__":
    print(main()[0])
