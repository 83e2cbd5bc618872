"""scripts/gpu_check.sh in its CPU dry mode: it starts, runs the tiny parts and skips the CUDA parts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_dry_mode(capsys):
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")], check=False).returncode == 0
    module = _module()
    rc = module.main(["--dry"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert rc == 0, report["failures"]
    assert report["cuda"] is False and "skipped" in report and "--dry" in captured.err
    assert "NCCL" in report["ddp"]["skipped"]
    assert "compiled bf16 steps are skipped" in report["compiled"]["skipped"]
    assert set(report["heads"]["fp32"]) >= {"flat", "semantic_softmax", "conditional_softmax", "hxe", "transhp"}
    assert all(r["ok"] for r in report["heads"]["fp32"].values())
    for part in ("decoders", "metrics"):  # the torch kernels on CPU tensors, host copies refused
        assert all(r["ok"] for r in report[part].values() if isinstance(r, dict)), report[part]
    assert {"expected_hfbeta", "bayes_node:cost=zhao+return_cost"} <= set(report["decoders"])
    assert "hierarchical_f1_score:node_sets" in report["metrics"]


@pytest.mark.slow
def test_compiled_bf16_step_matches_eager_on_cpu():
    """The compiled part on CPU for one head (what --compile-cpu runs for all): same first loss as eager to bf16
    precision, both step times reported. Compiling takes about a minute here, hence one head only."""
    module = _module()
    tax = module._tree(False)
    name, opts, size, batch = module._backbone(False)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=gen)
    y = torch.as_tensor(tax.leaves)[torch.randint(len(tax.leaves), (batch,), generator=gen)]
    res = module._eager_and_compiled(name, opts, tax, "semantic_softmax", x, y, steps=1)
    assert res["ok"], res
    assert res["eager_ms_per_step"] > 0 and res["compiled_ms_per_step"] > 0 and res["compiled_vs_eager"] > 0
