"""The Python part of ``scripts/gpu_check.sh``: AMP training steps of every head, a 1-GPU NCCL DDP step and the
decoders on the device, printed as ONE JSON of timings and ratios.

With CUDA: ViT-Tiny (64 px, 8 px patches) on ``imagenet21k_winter21``, batch 64, a few fp16 (with a gradient
scaler) and bf16 autocast steps per head, each head's step time as a ratio to the flat head's; the DDP step
runs under ``torchrun --nproc_per_node 1`` with the NCCL backend; every decoder decodes ``[1000, N]`` node
probabilities on the device, and so do the expected-cost functions: each must return tensors on the device without
a host copy (``Tensor.cpu`` / ``Tensor.numpy`` raise while it runs); a few metrics score device labels (copied to
the host, their array results back on the device). Then every head's bf16 step again, eager and through
``torch.compile`` (``model.compile: true``), with the same initial weights: ms per step of each, compiled / eager,
the compile time (the first step) and the first losses, which must agree to bf16 precision (``--no-compile`` skips
it; ``--compile-cpu`` runs it on the CPU as well, minutes per head).
Without CUDA, or with ``--dry``, the CPU-feasible parts run tiny (float32 steps of
every head on a 2-block ViT and a small tree, the decoders' torch kernels and the metrics on CPU tensors) and the
CUDA parts are skipped with a message; the exit status is then 0 when the tiny parts pass.

Usage: ``python scripts/gpu_check.py [--dry] [--steps 3] [--no-compile] [--compile-cpu]`` (``--ddp-worker`` is the
torchrun child).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _tree(cuda: bool):
    from hiercls.taxonomy import Taxonomy, load_taxonomy

    if cuda:
        return load_taxonomy("imagenet21k_winter21")
    edges = [("r", f"c{i}") for i in range(3)]
    edges += [(f"c{i}", f"c{i}.{j}") for i in range(3) for j in range(3)]
    edges += [(f"c{i}.{j}", f"c{i}.{j}.{k}") for i in range(3) for j in range(3) for k in range(2)]
    return Taxonomy(edges, name="gpu-check-tiny")


def _backbone(cuda: bool) -> tuple[str, dict[str, Any], int, int]:
    if cuda:
        return "timm:vit_tiny_patch16_224", {"img_size": 64, "patch_size": 8}, 64, 64
    return (
        "timm:vit_tiny_patch16_224",
        {"img_size": 16, "patch_size": 8, "depth": 3, "embed_dim": 32, "num_heads": 2},
        16,
        4,
    )


def _check_heads() -> list[str]:
    """flat first, every registered non-dense head, then TransHP (a flat head with prompts)."""
    from hiercls.heads import get_head_class, list_heads

    return ["flat", *[h for h in list_heads() if h != "flat" and not get_head_class(h).supports_dense], "transhp"]


def head_steps(device: torch.device, steps: int) -> dict[str, Any]:
    """Per head and precision: ms per training step, its ratio to flat, and node_probs staying on the device."""
    from hiercls.models import create_model

    cuda = device.type == "cuda"
    tax = _tree(cuda)
    name, opts, size, batch = _backbone(cuda)
    heads = _check_heads()
    precisions = ["fp16", "bf16"] if cuda else ["fp32"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=gen).to(device)
    leaves = torch.as_tensor(np.array(tax.leaves))
    y = leaves[torch.randint(len(leaves), (batch,), generator=gen)].to(device)
    out: dict[str, Any] = {"taxonomy": tax.name, "num_nodes": tax.num_nodes, "batch": batch, "steps": steps}
    for prec in precisions:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(prec)
        res: dict[str, Any] = {}
        for head in heads:
            try:
                torch.manual_seed(0)
                model = create_model(name, tax, head=head, **opts).to(device).train()
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
                scaler = torch.amp.GradScaler("cuda", enabled=prec == "fp16")

                def step(model=model, opt=opt, scaler=scaler, dtype=dtype) -> float:
                    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                        output = model(x)
                        loss = model.loss(output, y)
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad(set_to_none=True)
                    return float(loss.detach())

                step()  # warm-up
                _sync(device)
                t0 = time.perf_counter()
                losses = [step() for _ in range(steps)]
                _sync(device)
                ms = (time.perf_counter() - t0) / steps * 1e3
                with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    probs = model.node_probs(model(x))
                ok = (
                    all(math.isfinite(v) for v in losses)
                    and probs.device == x.device
                    and probs.dtype == torch.float32
                    and bool((probs[:, 0] == 1).all())
                )
                res[head] = {"ms_per_step": round(ms, 3), "loss": round(losses[-1], 5), "ok": bool(ok)}
            except Exception as err:  # reported, the other heads still run
                res[head] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        flat = res.get("flat", {}).get("ms_per_step")
        for r in res.values():
            if flat and "ms_per_step" in r:
                r["ratio_vs_flat"] = round(r["ms_per_step"] / flat, 3)
        out[prec] = res
    return out


def _bf16_step(model: Any, forward: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
    """One AdamW training step under bf16 autocast through ``forward`` (the model or its compiled wrapper)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = model.loss(forward(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def _eager_and_compiled(name: str, opts: dict[str, Any], tax: Any, head: str, x: Any, y: Any, steps: int) -> dict:
    """ms per bf16 step of one head, eager and through ``torch.compile`` (the same initial weights), and the
    first step's loss of each (they must agree to bf16 precision)."""
    from hiercls.models import create_model

    res: dict[str, Any] = {}
    for mode in ("eager", "compiled"):
        torch.manual_seed(0)
        model = create_model(name, tax, head=head, **opts).to(x.device).train()
        step = _bf16_step(model, torch.compile(model) if mode == "compiled" else model, x, y)
        _sync(x.device)
        t0 = time.perf_counter()
        first = step()  # the compiled model compiles here
        _sync(x.device)
        res[f"{mode}_first_step_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        losses = [first] + [step() for _ in range(steps)]
        _sync(x.device)
        res[f"{mode}_ms_per_step"] = round((time.perf_counter() - t0) / steps * 1e3, 3)
        res[f"{mode}_first_loss"] = round(first, 5)
        res.setdefault("finite", True)
        res["finite"] &= all(math.isfinite(v) for v in losses)
    res["compiled_vs_eager"] = round(res["compiled_ms_per_step"] / res["eager_ms_per_step"], 3)
    diff = abs(res["compiled_first_loss"] - res["eager_first_loss"])
    res["ok"] = bool(res.pop("finite") and diff <= 0.05 * abs(res["eager_first_loss"]) + 1e-2)
    return res


def compiled_steps(device: torch.device, steps: int, enabled: bool) -> dict[str, Any]:
    """Per head: a bf16 autocast training step eager and under ``torch.compile`` (``model.compile: true``), as
    ms per step (compilation in the untimed first step, reported apart) and compiled / eager."""
    if not enabled:
        why = "no CUDA (or --dry)" if device.type != "cuda" else "--no-compile"
        return {"skipped": f"{why}: compiled bf16 steps are skipped (torch.compile takes minutes per head on CPU)"}
    cuda = device.type == "cuda"
    tax = _tree(cuda)
    name, opts, size, batch = _backbone(cuda)
    heads = _check_heads()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=gen).to(device)
    leaves = torch.as_tensor(np.array(tax.leaves))
    y = leaves[torch.randint(len(leaves), (batch,), generator=gen)].to(device)
    out: dict[str, Any] = {"precision": "bf16", "batch": batch, "steps": steps}
    for head in heads:
        try:
            out[head] = _eager_and_compiled(name, opts, tax, head, x, y, steps)
        except Exception as err:  # reported, the other heads still run
            out[head] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
    return out


def _timed(device: torch.device, base: float, call: Any) -> dict[str, Any]:
    """ms of one call, its ratio to ``base``, and whether its output came back on the input's device."""
    try:
        _sync(device)
        t0 = time.perf_counter()
        out = call()
        _sync(device)
        dt = time.perf_counter() - t0
    except Exception as err:
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    res = {"ms": round(dt * 1e3, 3), "ratio_vs_argmax": round(dt / base, 2), "ok": True}
    for x in out if isinstance(out, tuple) else (out,):
        if isinstance(x, torch.Tensor) and x.device != device:
            res.update(ok=False, error=f"output on {x.device}, input on {device}")
    return res


def decoders(device: torch.device) -> dict[str, Any]:
    """Every decoder, and the expected-cost functions, on node probabilities that live on ``device``: ms per call
    (the decoders have one host implementation: a device batch goes to the host and back, by design), the ratio to
    ``argmax``, and whether the result came back on the device."""
    from hiercls.decode import RULES, bayes_node, decode, expected_cost, expected_hfbeta, prediction_expected_cost
    from hiercls.taxonomy.tensors import node_probs_from_leaves

    tax = _tree(device.type == "cuda")
    batch = 1000 if device.type == "cuda" else 16
    gen = torch.Generator().manual_seed(1)
    leaf = torch.softmax(3 * torch.randn(batch, tax.num_leaves, generator=gen), 1).to(device)
    probs = node_probs_from_leaves(tax, leaf)
    res: dict[str, Any] = {"batch": batch, "taxonomy": tax.name}
    _sync(device)
    base_t0 = time.perf_counter()
    probs.argmax(1)
    _sync(device)
    base = max(time.perf_counter() - base_t0, 1e-9)
    for rule in RULES:
        res[rule] = _timed(device, base, lambda rule=rule: decode(probs, tax, rule))
    sets = decode(probs, tax, "threshold_set")
    pred = decode(probs, tax, "argmax_leaf")
    extra = {
        "bayes_node:cost=zhao+return_cost": lambda: bayes_node(probs, tax, "zhao", return_cost=True),
        "bayes_node:cost=wu_palmer": lambda: bayes_node(probs, tax, "wu_palmer"),
        "expected_cost:ic_distance": lambda: expected_cost(probs, tax, "ic_distance"),
        "prediction_expected_cost:lca_height": lambda: prediction_expected_cost(probs, pred, tax, "lca_height"),
        "expected_hfbeta": lambda: expected_hfbeta(sets, probs, tax),
    }
    for name, call in extra.items():
        res[name] = _timed(device, base, call)
    return res


def metrics(device: torch.device) -> dict[str, Any]:
    """Metrics of labels that live on ``device`` (ids and node sets): ms per call (the labels are copied to the
    host, by design: the metrics have one NumPy implementation), array results back on the device."""
    import hiercls.metrics as M

    tax = _tree(device.type == "cuda")
    batch = 10_000 if device.type == "cuda" else 64
    gen = torch.Generator().manual_seed(2)
    y_true = torch.randint(0, tax.num_nodes, (batch,), generator=gen).to(device)
    y_pred = torch.where(torch.rand(batch, generator=gen).to(device) < 0.5, y_true, torch.zeros_like(y_true))
    pred_sets = torch.zeros(batch, tax.num_nodes, dtype=torch.bool, device=device)
    pred_sets[torch.arange(batch, device=device), y_pred] = True  # the metric closes them, on the device
    calls = {
        "hierarchical_f1_score": lambda: M.hierarchical_f1_score(y_true, y_pred, taxonomy=tax),
        "hierarchical_f1_score:macro": lambda: M.hierarchical_f1_score(
            y_true, y_pred, taxonomy=tax, average="macro", zero_division=0.0
        ),
        "mistake_severity:zhao": lambda: M.mistake_severity(y_true, y_pred, taxonomy=tax, distance="zhao"),
        "per_level_accuracy_score": lambda: M.per_level_accuracy_score(y_true, y_pred, taxonomy=tax),
        "hierarchical_f1_score:node_sets": lambda: M.hierarchical_f1_score(y_true, pred_sets, taxonomy=tax),
    }
    res: dict[str, Any] = {"batch": batch, "taxonomy": tax.name}
    for name, call in calls.items():
        r = _timed(device, 1.0, call)
        r.pop("ratio_vs_argmax", None)
        res[name] = r
    return res


def ddp_worker() -> int:
    """One DDP training step with NCCL on the local GPU (run by torchrun); prints one JSON line."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hiercls.heads import create_head

    dist.init_process_group("nccl")
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    tax = _tree(True)
    head = create_head("semantic_softmax", tax, 192).to(device)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 192), torch.nn.GELU(), head).to(device))
    x = torch.randn(32, 64, device=device)
    y = torch.as_tensor(np.array(tax.leaves[:32])).to(device)
    t0 = time.perf_counter()
    loss = head.loss(model(x), y)
    loss.backward()
    torch.cuda.synchronize(device)
    print(
        json.dumps(
            {
                "ddp_ok": bool(torch.isfinite(loss)),
                "ms": round((time.perf_counter() - t0) * 1e3, 3),
                "world_size": dist.get_world_size(),
                "backend": dist.get_backend(),
            }
        )
    )
    dist.destroy_process_group()
    return 0


def ddp_step(cuda: bool) -> dict[str, Any]:
    if not cuda:
        return {"skipped": "no CUDA (or --dry): the NCCL DDP step needs a GPU"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "1",
        os.path.abspath(__file__),
        "--ddp-worker",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "torchrun timed out after 240 s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        return {"ok": False, "error": f"torchrun exit {proc.returncode}", "stderr_tail": proc.stderr[-2000:]}
    res = json.loads(lines[-1])
    res["ok"] = bool(res.get("ddp_ok"))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="CPU only, tiny; skip the CUDA parts")
    ap.add_argument("--steps", type=int, default=None, help="timed training steps per head and precision")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled bf16 steps (CUDA)")
    ap.add_argument("--compile-cpu", action="store_true", help="run the compiled bf16 steps on CPU too (minutes)")
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ddp_worker:
        return ddp_worker()
    cuda = torch.cuda.is_available() and not args.dry
    device = torch.device("cuda" if cuda else "cpu")
    t0 = time.perf_counter()
    report: dict[str, Any] = {"check": "gpu_check", "cuda": cuda, "torch": torch.__version__}
    if cuda:
        report["device_name"] = torch.cuda.get_device_name(device)
    else:
        why = "--dry" if args.dry else "no CUDA device"
        report["skipped"] = (
            f"{why}: fp16/bf16 AMP steps, the NCCL DDP step and decoders on CUDA are skipped; the CPU parts ran tiny"
        )
        print(f"gpu_check: {report['skipped']}", file=sys.stderr)
    report["heads"] = head_steps(device, args.steps or (3 if cuda else 1))
    compile_on = (cuda and not args.no_compile) or args.compile_cpu
    report["compiled"] = compiled_steps(device, args.steps or (3 if cuda else 1), compile_on)
    for head, r in report["compiled"].items():
        if isinstance(r, dict) and "compiled_ms_per_step" in r:
            print(
                f"gpu_check: bf16 step {head}: eager {r['eager_ms_per_step']} ms, compiled "
                f"{r['compiled_ms_per_step']} ms ({r['compiled_vs_eager']}x eager; "
                f"compiling took {r['compiled_first_step_s']} s)",
                file=sys.stderr,
            )
    report["ddp"] = ddp_step(cuda)
    report["decoders"] = decoders(device)
    report["metrics"] = metrics(device)
    failures = [
        f"heads.{p}.{h}"
        for p, res in report["heads"].items()
        if isinstance(res, dict)
        for h, r in res.items()
        if isinstance(r, dict) and not r.get("ok", True)
    ]
    for part in ("decoders", "metrics"):
        failures += [f"{part}.{k}" for k, r in report[part].items() if isinstance(r, dict) and not r["ok"]]
    failures += [f"compiled.{h}" for h, r in report["compiled"].items() if isinstance(r, dict) and not r["ok"]]
    if cuda and not report["ddp"].get("ok"):
        failures.append("ddp")
    report["failures"] = failures
    report["elapsed_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(report, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
