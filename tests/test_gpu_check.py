"""scripts/gpu_check.sh in its CPU dry mode: it starts, runs the tiny parts and skips the CUDA parts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_mode(capsys):
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")], check=False).returncode == 0
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rc = module.main(["--dry"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert rc == 0, report["failures"]
    assert report["cuda"] is False and "skipped" in report and "--dry" in captured.err
    assert "NCCL" in report["ddp"]["skipped"]
    assert set(report["heads"]["fp32"]) >= {"flat", "semantic_softmax", "conditional_softmax", "hxe", "transhp"}
    assert all(r["ok"] for r in report["heads"]["fp32"].values())
    for part in ("decoders", "metrics"):  # the torch kernels on CPU tensors, host copies refused
        assert all(r["ok"] for r in report[part].values() if isinstance(r, dict)), report[part]
    assert {"expected_hfbeta", "bayes_node:cost=zhao+return_cost"} <= set(report["decoders"])
    assert "hierarchical_f1_score:node_sets" in report["metrics"]
