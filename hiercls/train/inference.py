"""Loading trained models and running them: what ``hiercls evaluate`` and ``hiercls predict`` stand on.

A *run folder* (``config.yaml`` + ``checkpoints/{best,last}``) or a *model folder* (``config.json`` +
``model.safetensors``, from ``save_pretrained``) can be given wherever a model is expected.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hiercls._textio import read_text
from hiercls.data import build_dataset, image_transform, subsample
from hiercls.decode import DecoderSpec, parse_decoder
from hiercls.models import HierarchicalClassifier, move_to_device
from hiercls.taxonomy import Taxonomy
from hiercls.train.config import TrainConfig, load_config
from hiercls.train.distributed import DistInfo, eval_loader
from hiercls.train.loop import evaluate_model

logger = logging.getLogger(__name__)

__all__ = ["IMAGE_EXTENSIONS", "evaluate_run", "load_trained_model", "predict", "read_inputs", "resolve_model_dir"]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def resolve_model_dir(path: str | os.PathLike[str], which: str = "best") -> tuple[Path, TrainConfig | None]:
    """The model folder for ``path`` and the run's config when there is one.

    ``path`` may be a run folder (its ``checkpoints/<which>``, falling back to ``last``), a checkpoint folder
    inside a run, or any ``save_pretrained`` folder.

    Raises:
        FileNotFoundError: nothing loadable at ``path`` (the message says what was looked for).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"model {str(p)!r} does not exist")
    if (p / "config.json").is_file():
        run = p.parent.parent if p.parent.name == "checkpoints" else None
        cfg = load_config(run / "config.yaml") if run is not None and (run / "config.yaml").is_file() else None
        return p, cfg
    for name in (which, "last", "best"):
        d = p / "checkpoints" / name
        if (d / "config.json").is_file():
            cfg = load_config(p / "config.yaml") if (p / "config.yaml").is_file() else None
            return d, cfg
    raise FileNotFoundError(
        f"{str(p)!r} is neither a saved model (config.json + model.safetensors) nor a run folder "
        "with checkpoints/best or checkpoints/last"
    )


def load_trained_model(
    path: str | os.PathLike[str], *, which: str = "best", device: str | torch.device = "cpu"
) -> tuple[HierarchicalClassifier, Taxonomy, TrainConfig | None]:
    """``(model in eval mode, its taxonomy, the run config or None)`` for a run or model folder.

    Every saved model loads through :meth:`HierarchicalClassifier.from_pretrained` (``conv3d`` run folders
    written before the model classes were merged included).
    """
    d, cfg = resolve_model_dir(path, which)
    model = HierarchicalClassifier.from_pretrained(d, map_location=device).eval()
    return model, model.taxonomy, cfg


def evaluate_run(
    model: nn.Module,
    taxonomy: Taxonomy,
    cfg: TrainConfig,
    *,
    split: str | None = None,
    decoders: Sequence[str] | None = None,
    max_samples: int | None = None,
    batch_size: int | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Hierarchical metrics of a trained model on a split of its recipe's data set.

    Args:
        model: the trained model (see :func:`load_trained_model`).
        taxonomy: its taxonomy.
        cfg: the recipe (its ``data`` section says which data set).
        split: the split (default the recipe's ``data.eval_split``).
        decoders: decoder specs for :func:`hiercls.decode.parse_decoder` (default the recipe's ``eval.decoders``).
        max_samples: evaluate a fixed subset (default the recipe's ``data.max_eval_samples``; ``0`` = all).
        batch_size: evaluation batch size.
    """
    split = split or cfg.data.eval_split or "val"
    transform = image_transform(model, train=False, image_size=cfg.data.image_size)
    ds = build_dataset(cfg.data.dataset, split, taxonomy, cfg.data.options, transform)
    limit = cfg.data.max_eval_samples if max_samples is None else (max_samples or None)
    ds = subsample(ds, limit)
    dev = torch.device(device)
    loader = eval_loader(
        ds,
        batch_size or cfg.data.eval_batch_size or cfg.data.batch_size,
        DistInfo(device=dev),
        getattr(model, "collate", None),
        0,
    )
    results, _, _ = evaluate_model(model, loader, taxonomy, list(decoders or cfg.eval.decoders), device=dev)
    return {"split": split, "samples": len(ds), **results}


def read_inputs(items: Sequence[str]) -> tuple[list[Any], list[str], str]:
    """Turn command-line inputs into model inputs: ``(inputs, labels for display, kind)``.

    Image files (by extension) become PIL images; a ``.txt`` file contributes one text per non-empty line;
    anything else is a text string. Mixing images and texts is an error.
    """
    inputs: list[Any] = []
    shown: list[str] = []
    kinds = set()
    for item in items:
        p = Path(item)
        if p.suffix.lower() in IMAGE_EXTENSIONS:
            if not p.is_file():
                raise FileNotFoundError(f"image {item!r} does not exist")
            from PIL import Image

            with Image.open(p) as im:
                inputs.append(im.convert("RGB"))
            shown.append(str(p))
            kinds.add("image")
        elif p.suffix.lower() == ".txt" and p.is_file():
            for line in read_text(p, "input list").splitlines():
                if line.strip():
                    inputs.append(line.strip())
                    shown.append(line.strip())
            kinds.add("text")
        else:
            inputs.append(item)
            shown.append(item)
            kinds.add("text")
    if len(kinds) > 1:
        raise ValueError("inputs mix image files and texts; give one kind per call")
    if not inputs:
        raise ValueError("no inputs (give texts, a .txt file with one text per line, or image files)")
    return inputs, shown, kinds.pop()


@torch.no_grad()
def predict(
    model: nn.Module,
    taxonomy: Taxonomy,
    inputs: Sequence[Any],
    *,
    decoder: str | DecoderSpec = "argmax_leaf",
    top_k: int = 5,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    image_size: int | None = None,
) -> list[dict[str, Any]]:
    """Predictions for raw inputs (texts or PIL images).

    Returns:
        Per input ``{"prediction": {"id", "name", "display_name", "prob"} | {"ids", "names", ...}``,
        ``"path": [display names root -> prediction]``, ``"top_k": [{"name", "display_name", "prob"}] (leaves)}``.
    """
    spec = parse_decoder(decoder)
    modality = getattr(model, "modality", "text" if isinstance(inputs[0], str) else "image")
    if modality == "text" and not all(isinstance(x, str) for x in inputs):
        raise ValueError("this is a text model: give text inputs")
    if modality == "image" and any(isinstance(x, str) for x in inputs):
        raise ValueError("this is an image model: give image files")
    transform = image_transform(model, train=False, image_size=image_size) if modality == "image" else None
    leaves = np.array(taxonomy.leaves)  # a writable copy (torch indexing warns on read-only arrays)
    k = max(1, min(top_k, len(leaves)))
    names, disp = taxonomy.names, taxonomy.display_names
    out: list[dict[str, Any]] = []
    model.eval()
    for start in range(0, len(inputs), batch_size):
        chunk = list(inputs[start : start + batch_size])
        batch = [(transform(x) if transform is not None else x, 0) for x in chunk]
        x, _ = model.collate(batch)
        probs = model.node_probs(model(move_to_device(x, torch.device(device)))).float().cpu()
        pred = torch.as_tensor(spec(probs, taxonomy))
        top = probs[:, leaves].topk(k, dim=1)
        for i in range(len(chunk)):
            if pred.dim() == 2:
                ids = pred[i].nonzero().flatten().tolist()
                ids = [j for j in ids if j != taxonomy.root]
                deepest = max(ids, key=lambda j: int(taxonomy.depth[j])) if ids else taxonomy.root
                prediction = {"ids": ids, "names": [names[j] for j in ids], "display_names": [disp[j] for j in ids]}
            else:
                deepest = int(pred[i])
                prediction = {
                    "id": deepest,
                    "name": names[deepest],
                    "display_name": disp[deepest],
                    "prob": float(probs[i, deepest]),
                }
            path = [disp[j] for j in taxonomy.path(deepest)] if taxonomy.is_tree else [disp[deepest]]
            out.append(
                {
                    "prediction": prediction,
                    "path": path,
                    "top_k": [
                        {"name": names[leaves[j]], "display_name": disp[leaves[j]], "prob": float(p)}
                        for p, j in zip(top.values[i].tolist(), top.indices[i].tolist(), strict=True)
                    ],
                }
            )
    return out
