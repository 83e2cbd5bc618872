"""Training throughput (samples/s) of every head against the flat softmax head on the same backbone.

One full optimizer step per measurement, exactly as the training loop does it (forward, the head's loss,
backward, gradient clipping, AdamW step), on random inputs so that data loading is not measured. Heads are
measured in interleaved rounds (flat, head A, head B, ..., flat, head A, ...) and the median per head is
kept, so that load changes on a shared machine hit every head alike. Prints JSON with samples/s and the
overhead ``head_step_time / flat_step_time - 1``.

Usage::

    python bench/bench_train.py            # ViT-Tiny at 64 px on an ImageNet-21K-sized tree
    python bench/bench_train.py --quick    # seconds: test_vit on a 60-node tree
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _timing import time_calls


def random_tree(num_classes: int, depth: int, seed: int = 0):
    """A random tree with about ``num_classes`` leaves and the given depth (stand-in when no shipped tree)."""
    from hiercls.taxonomy import Taxonomy

    rng = np.random.default_rng(seed)
    edges, frontier, next_id = [], ["root"], 0
    branching = max(2, round(num_classes ** (1.0 / depth)))
    for _ in range(depth):
        new = []
        for parent in frontier:
            k = int(rng.integers(1, 2 * branching))
            for _ in range(k):
                name = f"n{next_id}"
                next_id += 1
                edges.append((parent, name))
                new.append(name)
        frontier = new
    return Taxonomy(edges, name=f"random_{next_id}")


def load_tree(quick: bool):
    if quick:
        return random_tree(40, 3)
    try:
        from hiercls.taxonomy import load_taxonomy

        return load_taxonomy("imagenet21k_winter21")
    except Exception as err:  # the shipped tree may be absent in a partial checkout
        print(f"note: imagenet21k_winter21 unavailable ({err}); using a random tree of similar size", file=sys.stderr)
        return random_tree(10450, 5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny backbone and tree, a few seconds")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (median kept)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per measurement")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--heads", nargs="*", default=None, help="heads to measure (default: all + transhp)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from hiercls.heads import get_head_class, list_heads
    from hiercls.models import create_model
    from hiercls.train.config import TrainConfig
    from hiercls.train.loop import build_optimizer

    taxonomy = load_tree(args.quick)
    if args.quick:
        backbone, bb_opts, size = "timm:test_vit", {"img_size": 32}, 32
        batch, rounds, steps = args.batch_size or 16, args.rounds or 3, args.steps or 2
    else:
        backbone, bb_opts, size = "timm:vit_tiny_patch16_224", {"img_size": 64, "patch_size": 8}, 64
        batch, rounds, steps = args.batch_size or 32, args.rounds or 3, args.steps or 2
    heads = args.heads or [h for h in list_heads() if not get_head_class(h).supports_dense] + ["transhp"]
    if "flat" not in heads:
        heads = ["flat", *heads]
    heads = ["flat", *[h for h in heads if h != "flat"]]

    torch.manual_seed(0)
    x = torch.randn(batch, 3, size, size)
    leaves = torch.as_tensor(np.array(taxonomy.leaves))
    y = leaves[torch.randint(len(leaves), (batch,))]
    cfg = TrainConfig()
    setups = {}
    for head in heads:
        model = create_model(backbone, taxonomy, head=head, **bb_opts).train()
        setups[head] = (model, build_optimizer(model, cfg))

    def one_step(model, opt) -> None:
        loss = model.loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for model, opt in setups.values():  # warm-up (allocations, lazy init)
        one_step(model, opt)
    times: dict[str, list[float]] = {h: [] for h in heads}
    for _ in range(rounds):
        for head in heads:
            model, opt = setups[head]
            times[head].append(time_calls(lambda m=model, o=opt: one_step(m, o), steps))
    flat = statistics.median(times["flat"])
    results = {}
    for head in heads:
        t = statistics.median(times[head])
        results[head] = {
            "step_s": t,
            "samples_per_s": batch / t,
            "overhead_vs_flat": t / flat - 1.0,
            "params": sum(p.numel() for p in setups[head][0].parameters()),
        }
    out = {
        "bench": "train_step_throughput",
        "quick": args.quick,
        "backbone": backbone,
        "backbone_options": bb_opts,
        "image_size": size,
        "batch_size": batch,
        "rounds": rounds,
        "steps_per_round": steps,
        "taxonomy": taxonomy.name,
        "num_nodes": taxonomy.num_nodes,
        "num_leaves": taxonomy.num_leaves,
        "height": taxonomy.height,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "baseline": "flat",
        "heads": results,
        "target": "overhead_vs_flat < 0.05 for every head except transhp",
        "within_target": {h: r["overhead_vs_flat"] < 0.05 for h, r in results.items() if h not in ("flat", "transhp")},
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ---------------------------------------------------------------------------------------------- run_all cases
#: The training-step configuration of the run_all cases (quick and full alike, so that they agree): ViT-Tiny
#: (12 blocks, width 192) at 64 px with 8 px patches (65 tokens), batch 16, the 21K tree.
STEP_BACKBONE = ("timm:vit_tiny_patch16_224", {"img_size": 64, "patch_size": 8})
STEP_BATCH = 16


def _step_fn(model, opt, x, y):
    def step() -> None:
        loss = model.loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _train_setup(head: str, **head_options):
    def setup():
        from hiercls.models import create_model
        from hiercls.taxonomy import load_taxonomy
        from hiercls.train.config import TrainConfig
        from hiercls.train.loop import build_optimizer

        tax = load_taxonomy("imagenet21k_winter21")
        name, opts = STEP_BACKBONE
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(STEP_BATCH, 3, opts["img_size"], opts["img_size"], generator=gen)
        leaves = torch.as_tensor(np.array(tax.leaves))
        y = leaves[torch.randint(len(leaves), (STEP_BATCH,), generator=gen)]
        steps = []
        for h, hopts in ((head, head_options), ("flat", {})):
            torch.manual_seed(0)
            model = create_model(name, tax, head=h, head_options=hopts or None, **opts).train()
            steps.append(_step_fn(model, build_optimizer(model, TrainConfig()), x, y))
        return steps[0], steps[1]

    return setup


def cases(quick: bool) -> list:
    from _timing import Case

    from hiercls.heads import get_head_class, list_heads

    heads = [h for h in list_heads() if h != "flat" and not get_head_class(h).supports_dense]
    out = [
        Case(
            f"train/step_{h}_vs_flat_21k",
            1.05,
            setup=_train_setup(h),
            number=1,
            repeats=5 if quick else 9,
            note=f"AdamW step of ViT-Tiny 64px/8 + {h} vs + flat, batch {STEP_BATCH}, imagenet21k_winter21",
        )
        for h in heads
    ]
    out.append(
        Case(
            "train/step_transhp_default_vs_flat_21k",
            1.5,
            setup=_train_setup("transhp"),
            number=1,
            repeats=5 if quick else 9,
            note="TransHP with its default prompts vs the flat head on the same ViT-Tiny 64px/8",
        )
    )
    return out
