"""The shipped recipes: every one parses and validates; the cheap ones train one step on a small subset."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hiercls.train.config import load_config
from hiercls.train.loop import train

RECIPES = Path(__file__).resolve().parent.parent / "recipes"
CHEAP = ["quickstart.yaml", "fashion_mnist_efficientnet.yaml", "transhp_vit.yaml", "nested_regions_3d.yaml"]


def _needs(recipe: str) -> None:
    cfg = load_config(RECIPES / recipe)
    if cfg.taxonomy:
        try:
            from hiercls.taxonomy import load_taxonomy

            load_taxonomy(cfg.taxonomy)
        except Exception as err:  # a shipped taxonomy not built in this checkout
            pytest.skip(f"taxonomy {cfg.taxonomy!r} unavailable: {err}")
    if cfg.data.dataset == "fashion_mnist" and not Path("/usr/share/datasets/fashion-mnist").is_dir():
        pytest.skip("Fashion-MNIST files absent (apt-get install dataset-fashion-mnist)")


@pytest.mark.parametrize("recipe", CHEAP)
def test_cheap_recipe_trains_one_step(recipe: str, tmp_path: Path) -> None:
    _needs(recipe)
    small = [
        "schedule.max_steps=1",
        "data.max_train_samples=8",
        "data.max_eval_samples=4",
        "data.batch_size=4",
        f"run.out_dir={tmp_path}",
        "run.progress=false",
        "run.plot=false",
        "compare_heads=[]",
    ]
    cfg = load_config(RECIPES / recipe, small)
    if cfg.data.dataset == "nested_blobs_3d":
        cfg = load_config(
            RECIPES / recipe,
            [*small, "data.options.train_samples=4", "data.options.val_samples=4", "data.options.size=12"],
        )
    result = train(cfg)
    assert result["step"] == 1 and math.isfinite(result["train_loss"])
    assert any(k.endswith(("hF1_micro", "mean_dice")) for k in result)


def test_cluster_recipe_is_complete() -> None:
    cfg = load_config(RECIPES / "imagenet21k_semantic_softmax.yaml")
    assert cfg.taxonomy == "imagenet21k_winter21" and cfg.model.head == "semantic_softmax"
    assert cfg.data.batch_size == 1024 and cfg.run.resume == "auto" and cfg.run.save_every_steps
    assert cfg.eval.best_metric == "argmax_leaf/semantic_accuracy"
