"""hiercls inside a plain PyTorch loop: head + loss + decoder + metrics, no hiercls training code.

Run it: ``python examples/plain_loop.py`` (about 10 s on a laptop CPU). ``tests/test_examples_loops.py`` checks that
it reaches the same weights and metrics as ``hiercls train`` with the matching recipe (:data:`RECIPE`).
"""

from __future__ import annotations

import random

import numpy as np
import torch

from hiercls.data import build_dataset
from hiercls.decode import decode
from hiercls.metrics import hierarchical_f1_score, hierarchical_precision_score
from hiercls.models import create_model
from hiercls.taxonomy import Taxonomy

EDGES = [("root", c) for c in "ab"] + [(p, f"{p}{i}") for p in "ab" for i in range(3)]
#: The same run as a hiercls recipe (constant learning rate, no weight decay or clipping, data in order).
RECIPE = {
    "model": {"backbone": "timm:test_vit", "head": "semantic_softmax", "backbone_options": {"img_size": 16}},
    "data": {"dataset": "synthetic", "batch_size": 8, "shuffle": False, "options": {"kind": "image"}},
    "optim": {"lr": 3e-3, "weight_decay": 0.0, "min_lr_ratio": 1.0, "clip_grad_norm": None},
    "schedule": {"epochs": 2},
    "eval": {"decoders": ["optimal_hfbeta"]},
}


def main(seed: int = 0, epochs: int = 2, samples: int = 24) -> tuple[dict[str, float], torch.nn.Module]:
    """Train, decode for hF1 and score; returns ``(metrics, model)``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tax = Taxonomy(EDGES, name="toy")
    model = create_model("timm:test_vit", tax, head="semantic_softmax", img_size=16)
    options = {"kind": "image", "train_samples": samples, "val_samples": samples // 2}
    train_set = build_dataset("synthetic", "train", tax, options)
    val_set = build_dataset("synthetic", "val", tax, options)
    loader = torch.utils.data.DataLoader(train_set, batch_size=8, collate_fn=model.collate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for _ in range(epochs):
        for images, labels in loader:
            loss = model.loss(model(images), labels)  # labels: node ids, -1 = ignore
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.eval()
    val = torch.utils.data.DataLoader(val_set, batch_size=8, collate_fn=model.collate)
    with torch.no_grad():
        pairs = [(model.node_probs(model(x)), y) for x, y in val]
    probs, labels = torch.cat([p for p, _ in pairs]), torch.cat([y for _, y in pairs])
    sets = decode(probs, tax, "optimal_hfbeta")  # [B, N] node sets maximising expected hF1
    metrics = {
        "hF1_micro": float(hierarchical_f1_score(labels, sets, taxonomy=tax)),
        "hP_micro": float(hierarchical_precision_score(labels, sets, taxonomy=tax)),
    }
    return metrics, model


if __name__ == "__main__":
    print(main()[0])
