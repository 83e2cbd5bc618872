"""Benchmark: hierarchical prompting (TransHP) vs the plain backbone, forward + backward, same run.

Prints one JSON object. For each backbone (a timm ViT and a BERT-like encoder) it times a training step
(forward, loss, backward) of

* ``plain``: the backbone + a linear classifier over the leaves + cross-entropy;
* ``transhp``: the prompted model (default prompting blocks: one per coarse level, late in the network);

and reports the median step time, the bytes of activations autograd saves for the backward pass (a
deterministic, device-independent memory measure) and, on CUDA, the peak allocated memory, with the ratios
``transhp / plain``. Prompting is expected to cost a little more: ``M_l`` extra tokens in one block per level.

Usage:
    python bench/bench_prompt.py            # ViT-Ti/16 at 224 px, batch 16; MiniLM-sized BERT, seq 64
    python bench/bench_prompt.py --quick    # tiny configs, seconds
    python bench/bench_prompt.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import timm
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

from hiercls.models.prompt import PromptedTextEncoder, TransHPViT
from hiercls.taxonomy import Taxonomy


def balanced_taxonomy(branching: list[int]) -> Taxonomy:
    """A complete tree with the given branching per level (e.g. [10, 10, 10] -> 1000 leaves)."""
    edges, frontier = [], ["root"]
    for depth, k in enumerate(branching):
        nxt = []
        for parent in frontier:
            for i in range(k):
                child = f"{parent}.{i}" if depth else f"n{i}"
                edges.append((parent, child))
                nxt.append(child)
        frontier = nxt
    return Taxonomy(edges, name=f"balanced{'x'.join(map(str, branching))}")


def saved_activation_bytes(step: Callable[[], torch.Tensor]) -> int:
    """Bytes of distinct tensor storages autograd saves for backward during ``step()``."""
    seen: dict[tuple[int, str], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            seen[(storage.data_ptr(), str(t.device))] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. wrapped subclasses)
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step()
    loss.backward()
    return int(sum(seen.values()))


def time_steps(
    step: Callable[[], torch.Tensor], params: list[torch.nn.Parameter], repeats: int, device: torch.device
) -> list[float]:
    times = []
    for _ in range(repeats):
        for p in params:
            p.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def measure(
    models: dict[str, tuple[torch.nn.Module, Callable[[], torch.Tensor]]],
    repeats: int,
    warmup: int,
    device: torch.device,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (model, step) in models.items():
        model.train()
        params = list(model.parameters())
        time_steps(step, params, warmup, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        out[name] = {"saved_activation_bytes": saved_activation_bytes(step)}
        if device.type == "cuda":
            out[name]["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
        out[name]["times_ms"] = []
    # Interleave the timed repeats so that load on a shared machine hits both models alike.
    for _ in range(repeats):
        for name, (model, step) in models.items():
            out[name]["times_ms"].append(1e3 * time_steps(step, list(model.parameters()), 1, device)[0])
    for name in models:
        out[name]["median_ms"] = round(statistics.median(out[name]["times_ms"]), 3)
        out[name]["times_ms"] = [round(t, 3) for t in out[name]["times_ms"]]
    base, prompted = out["plain"], out["transhp"]
    out["ratio_time"] = round(prompted["median_ms"] / base["median_ms"], 4)
    out["ratio_saved_activations"] = round(prompted["saved_activation_bytes"] / base["saved_activation_bytes"], 4)
    if "cuda_peak_bytes" in base:
        out["ratio_cuda_peak"] = round(prompted["cuda_peak_bytes"] / base["cuda_peak_bytes"], 4)
    return out


def bench_vit(cfg: dict[str, Any], tax: Taxonomy, repeats: int, warmup: int, device: torch.device) -> dict[str, Any]:
    vit_kw = {
        "img_size": cfg["img"],
        "patch_size": cfg["patch"],
        "depth": cfg["depth"],
        "embed_dim": cfg["dim"],
        "num_heads": cfg["heads"],
        "drop_path_rate": 0.0,
    }
    torch.manual_seed(0)
    plain = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=tax.num_leaves, **vit_kw).to(device)
    torch.manual_seed(0)
    transhp = TransHPViT(timm.create_model("vit_tiny_patch16_224", pretrained=False, **vit_kw), tax).to(device)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg["batch"], 3, cfg["img"], cfg["img"], generator=g).to(device)
    leaves = torch.tensor(tax.leaves)
    t = leaves[torch.randint(0, len(leaves), (cfg["batch"],), generator=g)].to(device)
    leaf_t = torch.tensor(tax.leaf_index).to(device)[t]
    res = measure(
        {
            "plain": (plain, lambda: F.cross_entropy(plain(x), leaf_t)),
            "transhp": (transhp, lambda: transhp.loss(transhp(x), t)),
        },
        repeats,
        warmup,
        device,
    )
    res["config"] = {
        **cfg,
        "prompt_blocks": transhp.positions,
        "prompts_per_level": {lvl: len(tax.levels[lvl]) for lvl in transhp.prompt_levels},
    }
    return res


def bench_text(cfg: dict[str, Any], tax: Taxonomy, repeats: int, warmup: int, device: torch.device) -> dict[str, Any]:
    bert_cfg = BertConfig(
        vocab_size=1000,
        hidden_size=cfg["dim"],
        num_hidden_layers=cfg["depth"],
        num_attention_heads=cfg["heads"],
        intermediate_size=4 * cfg["dim"],
        max_position_embeddings=max(64, cfg["seq"]),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    enc = BertModel(bert_cfg, add_pooling_layer=False).to(device)
    head = torch.nn.Linear(cfg["dim"], tax.num_leaves).to(device)
    plain = torch.nn.ModuleDict({"enc": enc, "head": head})
    torch.manual_seed(0)
    prompted = PromptedTextEncoder(BertModel(bert_cfg, add_pooling_layer=False), tax).to(device)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 1000, (cfg["batch"], cfg["seq"]), generator=g).to(device)
    mask = torch.ones_like(ids)
    mask[: cfg["batch"] // 2, cfg["seq"] // 2 :] = 0
    leaves = torch.tensor(tax.leaves)
    t = leaves[torch.randint(0, len(leaves), (cfg["batch"],), generator=g)].to(device)
    leaf_t = torch.tensor(tax.leaf_index).to(device)[t]

    def plain_step() -> torch.Tensor:
        h = enc(input_ids=ids, attention_mask=mask).last_hidden_state
        w = mask[..., None].to(h.dtype)
        return F.cross_entropy(head((h * w).sum(1) / w.sum(1)), leaf_t)

    res = measure(
        {
            "plain": (plain, plain_step),
            "transhp": (prompted, lambda: prompted.loss(prompted(input_ids=ids, attention_mask=mask), t)),
        },
        repeats,
        warmup,
        device,
    )
    res["config"] = {**cfg, "prompt_layers": prompted.positions}
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny configurations that run in seconds")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    ap.add_argument("--repeats", type=int, default=None, help="timed steps per model (default 10, quick 5)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.quick:
        tax = balanced_taxonomy([3, 4, 5])
        vit_cfg = {"img": 32, "patch": 8, "depth": 4, "dim": 32, "heads": 2, "batch": 4}
        txt_cfg = {"dim": 32, "depth": 3, "heads": 2, "seq": 16, "batch": 4}
        repeats, warmup = args.repeats or 5, 1
    else:
        tax = balanced_taxonomy([10, 10, 10])  # 10 + 100 coarse classes, 1000 leaves (ImageNet-sized)
        vit_cfg = {"img": 224, "patch": 16, "depth": 12, "dim": 192, "heads": 3, "batch": 16}
        txt_cfg = {"dim": 384, "depth": 6, "heads": 12, "seq": 64, "batch": 16}
        repeats, warmup = args.repeats or 10, 2
    result = {
        "benchmark": "prompt",
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "taxonomy": {"nodes": tax.num_nodes, "leaves": tax.num_leaves, "height": tax.height},
        "vit": bench_vit(vit_cfg, tax, repeats, warmup, device),
        "text": bench_text(txt_cfg, tax, repeats, warmup, device),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
