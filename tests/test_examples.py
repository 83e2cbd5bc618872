"""The examples/ scripts run offline on CPU and reach what hiercls's own code path reaches on the same data and seed:
the same weights after the same deterministic steps (a plain loop with the same optimizer and hiercls's loss), and
the same metric values (hiercls.evaluation.Evaluator on the reference model's node probabilities)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torchmetrics

from hiercls.evaluation import Evaluator
from hiercls.metrics import flatten_results

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"hiercls_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float) -> None:
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert torch.allclose(got[k], v, atol=atol, rtol=1e-4), f"{k}: max diff {(got[k] - v).abs().max():.3g}"


def _reference_metrics(tax, probs: torch.Tensor, y: torch.Tensor, decoder: str, k: tuple[int, ...]) -> dict:
    ev = Evaluator(tax, [decoder], k=k, sync_on_compute=False)
    ev.update(probs, y)
    return {key.split("/", 1)[1]: v for key, v in ev.compute().items()}


def test_hf_trainer_example_equals_a_plain_loop(tmp_path: Path) -> None:
    ex = _load("hf_trainer")
    steps, lr = 3, 0.5
    out = ex.main(steps=steps, lr=lr, out_dir=tmp_path)
    ref = ex.build_model(ex.build_tiny_bert(tmp_path / "ref_bert", 0), seed=0)
    assert not any(torch.equal(v, out["model"].state_dict()[k]) for k, v in ref.state_dict().items() if "head" in k)
    batch = ref.backbone.tokenize([text for text, _ in ex.DATA])
    y = torch.tensor([ref.taxonomy.index(label) for _, label in ex.DATA])
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    ref.train()
    for _ in range(steps):
        opt.zero_grad()
        ref.loss(ref(batch), y).backward()
        opt.step()
    _same_weights(out["model"].state_dict(), ref.state_dict(), atol=1e-5)
    ref.eval()
    with torch.no_grad():
        probs = ref.node_probs(ref(batch))
    assert torch.allclose(torch.as_tensor(out["node_probs"]), probs, atol=1e-5)
    want = _reference_metrics(ref.taxonomy, probs, y, "argmax_leaf", (1,))
    got = out["metrics"]
    assert got.keys() == want.keys()
    for key, v in want.items():
        assert got[key] == (v if isinstance(v, str) else pytest.approx(v, rel=1e-9, nan_ok=True)), key
    # the saved model loads with transformers' AutoModel and its card shows the metrics
    from transformers import AutoModel

    loaded = AutoModel.from_pretrained(tmp_path / "model")
    _same_weights(loaded.state_dict(), out["model"].state_dict(), atol=0.0)
    card = (tmp_path / "model" / "README.md").read_text()
    assert f"| argmax_leaf | {got['accuracy']:.4f} | {got['hF1_micro']:.4f} |" in card


def test_lightning_example_equals_a_plain_loop() -> None:
    ex = _load("lightning_module")
    steps, batch_size, n_train, n_val = 5, 8, 24, 16
    out = ex.main(steps=steps, batch_size=batch_size, n_train=n_train, n_val=n_val)
    tax = ex.taxonomy()
    x, y = ex.make_data(tax, n_train + n_val, seed=0)
    torch.manual_seed(0)
    ref = ex.HierarchicalLitModule(tax, x.shape[1])
    opt = torch.optim.SGD(ref.parameters(), lr=ref.lr)
    batches = [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n_train, batch_size)]
    for step in range(steps):  # Lightning runs on into the next epoch, in the same (unshuffled) order
        xb, yb = batches[step % len(batches)]
        opt.zero_grad()
        ref.head.loss(ref(xb), yb).backward()
        opt.step()
    _same_weights(
        {k: v for k, v in out["module"].state_dict().items() if not k.startswith("val_metrics.")},
        {k: v for k, v in ref.state_dict().items() if not k.startswith("val_metrics.")},
        atol=1e-6,
    )
    with torch.no_grad():
        probs = ref.head.node_probs(ref(x[n_train:]))
    want = flatten_results(_reference_metrics(tax, probs, y[n_train:], "argmax_leaf", (1, 2)), prefix="val/")
    got = out["metrics"]
    assert got.keys() == want.keys()
    for key, v in want.items():  # Lightning logs float32 tensors
        assert got[key] == pytest.approx(v, rel=1e-6, abs=1e-7, nan_ok=True), key
    assert not math.isnan(got["val/hF1_micro"])
    # logged the torchmetrics way (self.log_dict of a MetricCollection), not through a hiercls workaround
    assert isinstance(out["module"].val_metrics, torchmetrics.MetricCollection)
    assert "flatten_results" not in (EXAMPLES / "lightning_module.py").read_text()
