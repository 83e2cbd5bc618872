"""The shipped recipes: every one parses and validates; the cheap ones train one step on a small subset.

The recipes are read where hiercls finds them (the checkout's ``recipes/``, or the installed ``hiercls.recipes``
when CI runs this file against the installed wheel).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from hiercls.cli import main
from hiercls.cli.recipes_cmd import shipped_recipe, shipped_recipes
from hiercls.models.weights import minilm_path, resolve_package_weights
from hiercls.train.config import load_config
from hiercls.train.loop import train

CHEAP = ["quickstart.yaml", "fashion_mnist_efficientnet.yaml", "transhp_vit.yaml", "nested_regions_3d.yaml"]


def _needs_weights(backbone: str, weights: object) -> None:
    """Skip when the recipe's offline weights (the ``[assets]`` extra) are not installed."""
    try:
        if backbone == "hf:minilm":
            minilm_path()
        elif weights == "package" and backbone.startswith("timm:"):
            resolve_package_weights(backbone.removeprefix("timm:")).path()
    except FileNotFoundError as err:
        pytest.skip(f"the [assets] extra is not installed: {err}")


def _needs(recipe: str) -> None:
    cfg = load_config(shipped_recipe(recipe))
    _needs_weights(cfg.model.backbone, cfg.model.weights)
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
    cfg = load_config(shipped_recipe(recipe), small)
    if cfg.data.dataset == "nested_blobs_3d":
        cfg = load_config(
            shipped_recipe(recipe),
            [*small, "data.options.train_samples=4", "data.options.val_samples=4", "data.options.size=12"],
        )
    result = train(cfg)
    assert result["step"] == 1 and math.isfinite(result["train_loss"])
    assert any(k.endswith(("hF1_micro", "mean_dice")) for k in result)


def test_cluster_recipe_is_complete() -> None:
    cfg = load_config(shipped_recipe("imagenet21k_semantic_softmax"))
    assert cfg.taxonomy == "imagenet21k_winter21" and cfg.model.head == "semantic_softmax"
    assert cfg.data.batch_size == 1024 and cfg.run.resume == "auto" and cfg.run.save_every_steps
    assert cfg.eval.best_metric == "argmax_leaf/semantic_accuracy"


# ------------------------------------------------------------------------------ hiercls recipes, hiercls train NAME
ROOT = Path(__file__).resolve().parents[1]


def test_one_copy_of_each_recipe() -> None:
    """The checkout keeps the recipes in ``recipes/`` only; the wheel installs that folder as ``hiercls.recipes``."""
    names = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    assert names and not (ROOT / "hiercls" / "recipes").exists()
    assert sorted(shipped_recipes()) == names


def test_recipes_list_show_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["recipes", "list"]) == 0
    listed = capsys.readouterr().out
    for path in (ROOT / "recipes").glob("*.yaml"):
        description = yaml.safe_load(path.read_text(encoding="utf-8"))["description"]
        assert f"{path.stem}  " in listed and description in listed, path.stem
    assert main(["recipes", "show", "nested_regions_3d.yaml"]) == 0
    assert capsys.readouterr().out == (ROOT / "recipes" / "nested_regions_3d.yaml").read_text(encoding="utf-8")

    assert main(["recipes", "copy", "nested_regions_3d"]) == 0
    copied = tmp_path / "nested_regions_3d.yaml"
    assert copied.read_bytes() == (ROOT / "recipes" / "nested_regions_3d.yaml").read_bytes()
    copied.write_text("name: mine\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["recipes", "copy", "nested_regions_3d", "."]) == 2  # never over an existing file
    err = capsys.readouterr().err
    assert "nested_regions_3d.yaml exists" in err and "never overwrites" in err
    assert copied.read_text(encoding="utf-8") == "name: mine\n"
    assert main(["recipes", "copy", "quickstart", "qs.yaml"]) == 0 and (tmp_path / "qs.yaml").is_file()
    assert main(["recipes", "show", "quikstart"]) == 2
    assert "unknown recipe 'quikstart' (did you mean 'quickstart'?); shipped recipes: " in capsys.readouterr().err


def test_train_takes_a_shipped_recipe_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    for spec in ("transhp_vit", "transhp_vit.yaml", "recipes/transhp_vit.yaml"):
        assert main(["train", spec, "--print-config"]) == 0
        assert yaml.safe_load(capsys.readouterr().out)["name"] == "transhp_vit", spec
    (tmp_path / "transhp_vit.yaml").write_text("name: mine\n", encoding="utf-8")  # a file of that name wins
    assert main(["train", "transhp_vit.yaml", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["name"] == "mine"
    assert main(["train", "sub/transhp_vit.yaml", "--print-config"]) == 2  # a path is only ever that path
    assert "sub/transhp_vit.yaml" in capsys.readouterr().err
