"""Training-step time of every head against the flat softmax head on the same backbone, in one process.

One measured step is exactly what the training loop does (forward, the head's loss, backward, gradient
clipping, AdamW step), on fixed random inputs so that data loading is not measured. All heads are timed as one
group against one flat baseline (:func:`_timing.compare_group`): a repeat times one flat step and then one step
of every head (forward order on even repeats, backward on odd ones), so that the baseline is paid once per repeat
instead of once per head and the same minutes buy about twice the repeats. The verdict is on the ratio of the
fastest steps (``ratio_of_min``: machine load only adds time, so each side's fastest step over the repeats
estimates its unloaded time); the per-repeat ratios' median and spread (quartiles, min, max) are reported with it.

The quick and full modes measure the same configuration (``STEP_BACKBONE``: ViT-Tiny, 12 blocks, width 192,
at 64 px with 8 px patches, 65 tokens; batch ``STEP_BATCH`` = 16; the ``imagenet21k_winter21`` tree, 10,450
nodes) and differ only in the number of repeats (``QUICK_REPEATS`` / ``FULL_REPEATS``), so that both give the
same verdict; a smaller model or tree would change the share of the head in the step, i.e. the ratio itself.

Usage::

    python bench/bench_train.py                 # every head and TransHP, FULL_REPEATS repeats each
    python bench/bench_train.py --quick         # the same steps, QUICK_REPEATS repeats
    python bench/bench_train.py --heads hxe semantic_softmax --repeats 21
    python bench/bench_train.py --speed [--device cuda]   # compiled and channels-last steps beside eager

``--speed`` measures the speed switches of a recipe (issue 26) as reference ratios (no target: the gain depends
on the device): the semantic-softmax step of the same ViT-Tiny compiled (``model.compile``) against eager, and
a ResNet-18 step (``SPEED_CNN``, convolutions: where the memory format matters) in channels-last
(``model.channels_last``) against the default layout; on CUDA both under bf16 autocast, as the loop runs them.
Compilation happens in the untimed warmup calls.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Case, steady_allocator

#: The training-step configuration (quick and full alike): ViT-Tiny at 64 px with 8 px patches.
STEP_BACKBONE = ("timm:vit_tiny_patch16_224", {"img_size": 64, "patch_size": 8})
STEP_BATCH = 16
STEP_TAXONOMY = "imagenet21k_winter21"
#: Interleaved repeats (one step of flat and one of every head each). A step takes about 0.5 s on one thread;
#: the fastest of 7 steps still moved a head's ratio between 0.99 and 1.07 across runs, that of 21 within 1%.
QUICK_REPEATS = 12
FULL_REPEATS = 25
#: The ``group`` of the training-step cases: one flat baseline timing per repeat serves them all.
GROUP = "train/vs_flat_21k"
#: Heads whose step must stay within this factor of flat's; TransHP (extra tokens in one block) has its own.
HEAD_TARGET = 1.05
TRANSHP_TARGET = 1.3  # issue 25: TransHP default <= 1.3x flat

#: The convolutional backbone of the channels-last case, at 64 px.
SPEED_CNN = ("timm:resnet18", {})
SPEED_WARMUP = 3  # untimed calls: a compiled step compiles on the first, recompiles at most once after

_CACHE: dict[str, object] = {}


def _inputs() -> tuple[object, torch.Tensor, torch.Tensor]:
    if "inputs" not in _CACHE:
        from hiercls.taxonomy import load_taxonomy

        tax = load_taxonomy(STEP_TAXONOMY)
        size = STEP_BACKBONE[1]["img_size"]
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(STEP_BATCH, 3, size, size, generator=gen)
        leaves = torch.as_tensor(np.array(tax.leaves))
        y = leaves[torch.randint(len(leaves), (STEP_BATCH,), generator=gen)]
        _CACHE["inputs"] = (tax, x, y)
    return _CACHE["inputs"]  # type: ignore[return-value]


def build_step(head: str, **head_options: object) -> Callable[[], None]:
    """One training step of ``head`` on the shared backbone configuration and inputs (a fresh model)."""
    from hiercls.models import create_model
    from hiercls.train.config import TrainConfig
    from hiercls.train.loop import build_optimizer

    tax, x, y = _inputs()
    name, opts = STEP_BACKBONE
    torch.manual_seed(0)  # the same backbone weights for every head
    model = create_model(name, tax, head=head, head_options=head_options or None, **opts).train()
    opt = build_optimizer(model, TrainConfig())

    def step() -> None:
        loss = model.loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step.model = model  # type: ignore[attr-defined]
    return step


def build_speed_step(
    backbone: tuple[str, dict[str, object]], *, compiled: bool = False, channels_last: bool = False, device: str = "cpu"
) -> Callable[[], None]:
    """A semantic-softmax training step on ``backbone`` with the loop's switches (a fresh model, seed 0)."""
    from hiercls.models import create_model
    from hiercls.train.config import TrainConfig
    from hiercls.train.loop import build_optimizer

    tax, x, y = _inputs()
    torch.manual_seed(0)
    model = create_model(backbone[0], tax, head="semantic_softmax", **backbone[1]).train().to(device)
    x, y = x.to(device), y.to(device)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    forward = torch.compile(model) if compiled else model
    opt = build_optimizer(model, TrainConfig())
    amp = torch.device(device).type == "cuda"

    def step() -> None:
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=amp):
            loss = model.loss(forward(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def speed_cases(quick: bool, device: str = "cpu") -> list[Case]:
    """Reference ratios (no target) of the speed switches: compiled vs eager, channels-last vs default layout."""
    repeats = QUICK_REPEATS if quick else FULL_REPEATS
    vit, cnn = STEP_BACKBONE, (SPEED_CNN[0], {**SPEED_CNN[1]})
    out = []
    for name, backbone, switch in (
        ("train/step_compiled_vs_eager_vit", vit, {"compiled": True}),
        ("train/step_channels_last_vs_eager_resnet18", cnn, {"channels_last": True}),
    ):

        def setup(backbone=backbone, switch=switch) -> tuple[Callable[[], None], Callable[[], None]]:
            return build_speed_step(backbone, device=device, **switch), build_speed_step(backbone, device=device)

        out.append(
            Case(
                name,
                None,
                setup=setup,
                number=1,
                repeats=repeats,
                statistic="min",
                warmup=SPEED_WARMUP,
                device=device,
                note=f"{name.split('_vs_')[0].removeprefix('train/step_')} step vs eager, {backbone[0]} 64px, "
                f"batch {STEP_BATCH}, semantic_softmax, {STEP_TAXONOMY}",
            )
        )
    return out


def flat_step() -> Callable[[], None]:
    """The flat baseline's step, built once per process."""
    if "flat" not in _CACHE:
        _CACHE["flat"] = build_step("flat")
    return _CACHE["flat"]  # type: ignore[return-value]


def _train_setup(
    head: str, extra: dict[str, object], **head_options: object
) -> Callable[[], tuple[Callable[[], None], Callable[[], None]]]:
    def setup() -> tuple[Callable[[], None], Callable[[], None]]:
        step = build_step(head, **head_options)
        extra["params"] = sum(p.numel() for p in step.model.parameters())  # type: ignore[attr-defined]
        return step, flat_step()

    return setup


def compared_heads() -> list[str]:
    """Every registered single-feature head except flat (dense heads need a dense backbone)."""
    from hiercls.heads import get_head_class, list_heads

    return [h for h in list_heads() if h != "flat" and not get_head_class(h).supports_dense]


def cases(quick: bool, heads: list[str] | None = None) -> list[Case]:
    """One case per head (default: :func:`compared_heads` and ``"transhp"``), all in :data:`GROUP`."""
    repeats = QUICK_REPEATS if quick else FULL_REPEATS
    out = []
    for head in heads or [*compared_heads(), "transhp"]:
        extra: dict[str, object] = {}
        transhp = head == "transhp"
        out.append(
            Case(
                "train/step_transhp_default_vs_flat_21k" if transhp else f"train/step_{head}_vs_flat_21k",
                TRANSHP_TARGET if transhp else HEAD_TARGET,
                setup=_train_setup(head, extra),
                number=1,
                repeats=repeats,
                statistic="min",
                group=GROUP,
                extra=extra,
                note=(
                    "TransHP with its default prompts vs the flat head on the same ViT-Tiny 64px/8"
                    if transhp
                    else f"AdamW step of ViT-Tiny 64px/8 + {head} vs + flat, batch {STEP_BATCH}, {STEP_TAXONOMY}"
                ),
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REPEATS} repeats instead of {FULL_REPEATS}")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (overrides)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: stable ratios)")
    parser.add_argument("--heads", nargs="*", default=None, help="heads to measure (default: all + transhp)")
    parser.add_argument("--speed", action="store_true", help="the compiled / channels-last steps beside eager")
    parser.add_argument("--device", default="cpu", help="device of the --speed steps (cpu, cuda)")
    args = parser.parse_args(argv)
    from run_all import run_case, run_group

    torch.set_num_threads(args.threads)
    allocator = steady_allocator()
    if args.speed:
        speed = {}
        for case in speed_cases(args.quick, args.device):
            r = run_case(case, args.quick, args.repeats)
            speed[case.name.removeprefix("train/step_")] = {
                "ratio": r["ratio"],
                "step_s": r["candidate_s"],
                "eager_step_s": r["baseline_s"],
                "note": case.note,
            }
        info = {"device": args.device, "threads": torch.get_num_threads(), "torch": torch.__version__}
        print(json.dumps({"bench": "train_step_speed_switches", "quick": args.quick, **info, "cases": speed}, indent=2))
        return 0
    selected = cases(args.quick, [h for h in args.heads if h != "flat"] if args.heads else None)
    results = {}
    for case, r in zip(selected, run_group(selected, args.quick, args.repeats), strict=True):
        keys = ("ratio", "ratio_median", "ratio_q1", "ratio_q3", "ratio_min", "ratio_max", "params", "target", "pass")
        results[case.name.removeprefix("train/step_").removesuffix("_vs_flat_21k")] = {
            **{k: r[k] for k in keys},
            "step_s": r["candidate_s"],
            "flat_step_s": r["baseline_s"],
            "samples_per_s": round(STEP_BATCH / r["candidate_s"], 2),
        }
    tax, _, _ = _inputs()
    out = {
        "bench": "train_step_vs_flat",
        "quick": args.quick,
        "backbone": STEP_BACKBONE[0],
        "backbone_options": STEP_BACKBONE[1],
        "batch_size": STEP_BATCH,
        "repeats": selected[0].repeats if args.repeats is None else args.repeats,
        "taxonomy": tax.name,  # type: ignore[attr-defined]
        "num_nodes": tax.num_nodes,  # type: ignore[attr-defined]
        "threads": torch.get_num_threads(),
        "allocator": allocator,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "heads": results,
        "all_pass": all(r["pass"] for r in results.values()),
    }
    print(json.dumps(out, indent=2))
    return 0 if out["all_pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
