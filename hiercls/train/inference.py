"""A trained model with the recipe it was trained from: what ``hiercls evaluate`` and ``hiercls predict`` load.

Running a saved model lives in :mod:`hiercls.models.inference` (:func:`~hiercls.models.inference.predict`) and
scoring it in :mod:`hiercls.evaluation.model` (:func:`~hiercls.evaluation.model.evaluate_run`); this module adds
the run's recipe, a :class:`~hiercls.train.config.TrainConfig`.
"""

from __future__ import annotations

import os

import torch

from hiercls.models import HierarchicalClassifier
from hiercls.models.inference import resolve_model_dir
from hiercls.taxonomy import Taxonomy
from hiercls.train.config import TrainConfig, load_config

__all__ = ["load_trained_model"]


def load_trained_model(
    path: str | os.PathLike[str],
    *,
    which: str = "best",
    device: str | torch.device = "cpu",
    trust_edits: bool = False,
) -> tuple[HierarchicalClassifier, Taxonomy, TrainConfig | None]:
    """``(model in eval mode, its taxonomy, the run config or None)`` for a run or model folder.

    ``path`` is found by :func:`hiercls.models.inference.resolve_model_dir`. Every saved model loads through
    :meth:`HierarchicalClassifier.from_pretrained` (``conv3d`` run folders written before the model classes were
    merged included). ``trust_edits``: load a folder whose files were edited since it was saved, with a warning
    naming them (:func:`hiercls.models.classifier.verify_model_files`).
    """
    d, recipe = resolve_model_dir(path, which)
    model = HierarchicalClassifier.from_pretrained(d, map_location=device, trust_edits=trust_edits).eval()
    return model, model.taxonomy, load_config(recipe) if recipe is not None else None
