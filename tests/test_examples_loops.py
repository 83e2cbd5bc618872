"""The plain-PyTorch and timm-script examples reach the weights and metrics of ``hiercls train``."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hiercls.train import config_from_dict, train

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hiercls_run(tmp_path_factory):
    """``hiercls train`` with the examples' recipe: (results, final weights)."""
    plain = _example("plain_loop")
    tmp = tmp_path_factory.mktemp("run")
    tax_file = tmp / "toy.txt"
    tax_file.write_text("".join(f"{p} {c}\n" for p, c in plain.EDGES), encoding="utf-8")
    recipe = copy.deepcopy(plain.RECIPE)
    recipe["taxonomy"] = str(tax_file)
    recipe["data"]["options"].update(train_samples=24, val_samples=12)
    recipe["run"] = {"out_dir": str(tmp / "out"), "progress": False, "plot": False, "seed": 0, "device": "cpu"}
    results = train(config_from_dict(recipe))
    return results, load_file(str(tmp / "out" / "checkpoints" / "last" / "model.safetensors"))


@pytest.mark.parametrize("name", ["plain_loop", "timm_script"])
def test_example_matches_hiercls_train(name, hiercls_run):
    results, weights = hiercls_run
    metrics, model = _example(name).main(seed=0, epochs=2, samples=24)
    state = model.state_dict()
    assert set(state) == set(weights)
    for key, value in weights.items():
        torch.testing.assert_close(state[key], value, rtol=1e-5, atol=1e-6, msg=f"{name}: weight {key}")
    for key, value in metrics.items():
        assert value == pytest.approx(results[f"optimal_hfbeta/{key}"], abs=1e-9), key
