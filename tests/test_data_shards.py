"""Tar shards: ``hiercls data shard`` writes them from an image folder of Fashion-MNIST images, and the reader gives
every sample exactly once per epoch over ranks and workers (2 gloo processes included), in a seeded order, and
resumes at the exact sample."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hiercls.cli import main
from hiercls.data import FashionMNIST, HierImageFolder, build_dataset, make_loader
from hiercls.data.images import FASHION_MNIST_ROOT
from hiercls.data.shards import ShardDataset, expand_shards, merged_counts, read_shard
from hiercls.taxonomy import TaxonomyError

pytestmark = pytest.mark.skipif(
    not (Path(FASHION_MNIST_ROOT) / "t10k-images-idx3-ubyte.gz").is_file()
    and not (Path(FASHION_MNIST_ROOT) / "t10k-images-idx3-ubyte").is_file(),
    reason="Fashion-MNIST (Debian package dataset-fashion-mnist) is not installed",
)

N_IMAGES = 96  # 12 shards of 8: divisible by 2 ranks x 2 workers


def _ident(image: torch.Tensor) -> str:
    return hashlib.sha1(image.numpy().tobytes()).hexdigest()


@pytest.fixture(scope="module")
def fashion(tmp_path_factory):
    """``(folder of PNGs by class, its taxonomy, {image hash: node})``: distinct Fashion-MNIST test images."""
    ds = FashionMNIST("test")
    root = tmp_path_factory.mktemp("fashion") / "src"
    seen: dict[str, int] = {}
    for i in range(len(ds)):
        arr = ds.images[i]
        ident = _ident(torch.from_numpy(np.repeat(arr[None], 3, 0)).float().div(255.0))
        if ident in seen:
            continue
        node = int(ds.targets[i])
        folder = root / ds.taxonomy.name_of(node)  # "T-shirt/top" nests: the folder's path is the node name
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).save(folder / f"{i}.png")
        seen[ident] = node
        if len(seen) == N_IMAGES:
            break
    return root, ds.taxonomy, seen


@pytest.fixture(scope="module")
def shards(fashion, tmp_path_factory):
    root = fashion[0]
    out = tmp_path_factory.mktemp("shards") / "train"
    assert main(["data", "shard", str(root), str(out), "--taxonomy", "fashion_mnist", "--shard-size", "8"]) == 0
    return out


def _epoch(loader, epoch: int) -> list[tuple[str, int]]:
    loader.set_epoch(epoch)
    return [(_ident(x), int(y)) for xs, ys in loader for x, y in zip(xs, ys, strict=True)]


def test_shard_command_writes_the_folder_once_and_never_overwrites(fashion, shards, capsys):
    root, taxonomy, _ = fashion
    files = expand_shards(shards)
    assert [p.name for p in files] == [f"shard-{i:06d}.tar" for i in range(N_IMAGES // 8)]
    index = json.loads((shards / "index.json").read_text())
    assert [e["samples"] for e in index["shards"]] == [8] * 12
    # The tar members: <key>.png + <key>.cls holding the node name, one pair per image of the folder.
    samples = [s for p in files for s in read_shard(p)]
    folder = HierImageFolder(root, taxonomy)
    assert len(samples) == len(folder) == N_IMAGES
    assert Counter(label for *_, label in samples) == Counter(taxonomy.name_of(t) for _, t in folder.samples)
    with tarfile.open(files[0]) as tar:
        assert tar.getnames()[:2] == ["000000000.png", "000000000.cls"]
    assert main(["data", "shard", str(root), str(shards), "--taxonomy", "fashion_mnist", "--shard-size", "8"]) == 2
    assert "shard-000000.tar exists" in capsys.readouterr().err
    assert len(expand_shards(shards)) == 12 and not list(shards.glob(".*.tmp"))


def _written(out: Path) -> list[tuple[bytes, str]]:
    return [(data, label) for p in expand_shards(out) for _, _, data, label in read_shard(p)]


@pytest.mark.parametrize("seed", [None, 5])
def test_shards_mix_the_labels_in_a_seeded_order_unless_asked_to_keep_the_folders(fashion, shards, tmp_path, seed):
    """By default (seed 0) and with ``--shuffle-seed``, the folder's samples go permuted by
    ``np.random.default_rng(seed).permutation``, every shard of 8 mixed; ``--keep-order`` writes the folder's
    order, where a shard holds one or two labels (what the reader's shuffle buffer would have to mix)."""
    root, taxonomy, _ = fashion
    folder = HierImageFolder(root, taxonomy).samples
    args = ["data", "shard", str(root), str(tmp_path / "o"), "--taxonomy", "fashion_mnist", "--shard-size", "8"]
    assert main([*args, "--keep-order"]) == 0
    assert _written(tmp_path / "o") == [(Path(path).read_bytes(), taxonomy.name_of(node)) for path, node in folder]
    assert all(len({label for *_, label in read_shard(p)}) <= 2 for p in expand_shards(tmp_path / "o"))
    out = shards if seed is None else tmp_path / "mixed"  # the module's shards: the default
    if seed is not None:
        args[3] = str(out)
        assert main([*args, "--shuffle-seed", str(seed)]) == 0
    expected = [folder[i] for i in np.random.default_rng(seed or 0).permutation(len(folder))]
    assert _written(out) == [(Path(path).read_bytes(), taxonomy.name_of(node)) for path, node in expected]
    assert all(len({label for *_, label in read_shard(p)}) > 2 for p in expand_shards(out))
    with pytest.raises(SystemExit) as info:  # one order or the other, refused at parse time
        main([*args, "--shuffle-seed", "1", "--keep-order"])
    assert info.value.code == 2


def test_reader_gives_every_sample_once_with_its_label_in_a_seeded_order(fashion, shards):
    _, taxonomy, seen = fashion
    for workers in (0, 2):
        ds = ShardDataset(shards, taxonomy, buffer_size=5)
        loader = make_loader(ds, 5, shuffle=True, seed=3, num_workers=workers)
        first = _epoch(loader, 0)
        assert len(loader) == -(-N_IMAGES // 5)
        assert sorted(first) == sorted(seen.items())  # every image once, with the label of its folder
        assert _epoch(loader, 0) == first  # the same epoch again: the same order
        assert _epoch(loader, 1) != first and sorted(_epoch(loader, 1)) == sorted(first)
    plain = make_loader(ShardDataset(shards, taxonomy), 8, shuffle=False)
    in_tar_order = [(_ident(ds_x), y) for p in expand_shards(shards) for ds_x, y in _decoded(p, taxonomy)]
    assert _epoch(plain, 0) == in_tar_order


def _decoded(path: Path, taxonomy) -> list:
    ds = ShardDataset(path, taxonomy)
    return [ds[i] for i in range(len(ds))]  # random access (evaluation's path) reads the same samples


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_split_the_shards_and_resume_continues_at_the_next_sample(fashion, shards, workers):
    _, taxonomy, seen = fashion
    per_rank = []
    for rank in range(2):
        ds = ShardDataset(shards, taxonomy, buffer_size=4)
        loader = make_loader(ds, 4, shuffle=True, seed=7, rank=rank, world_size=2, num_workers=workers)
        full = _epoch(loader, 2)
        assert len(full) == N_IMAGES // 2
        # Interrupt after 5 batches, resume in a fresh loader from the saved state: the rest is the same.
        loader.set_epoch(2)
        it = iter(loader)
        for _ in range(5):
            next(it)
        state = loader.state_dict()
        del it
        assert state["index"] == 5 * 4 * 2
        fresh = make_loader(
            ShardDataset(shards, taxonomy, buffer_size=4),
            4,
            shuffle=True,
            seed=7,
            rank=rank,
            world_size=2,
            num_workers=workers,
        )
        fresh.load_state_dict(state)
        assert len(fresh) == N_IMAGES // 2 // 4 - 5
        assert _epoch(fresh, 2) == full[5 * 4 :]
        per_rank.append(full)
    assert sorted(per_rank[0] + per_rank[1]) == sorted(seen.items())
    with pytest.raises(ValueError, match="num_workers=3"):
        fresh.load_state_dict({**state, "num_workers": 3})


def test_uneven_shards_stop_every_rank_at_the_smallest_count(fashion, shards, caplog):
    """11 shards over 2 ranks: 6 and 5 shards; both ranks take 40 samples, the 8 others wait for another epoch."""
    taxonomy = fashion[1]
    files = expand_shards(shards)[:11]
    got = []
    for rank in range(2):
        loader = make_loader(ShardDataset(files, taxonomy), 8, shuffle=True, seed=1, rank=rank, world_size=2)
        with caplog.at_level(logging.WARNING, logger="hiercls.data.shards"):
            got.append(_epoch(loader, 0))
    assert [len(g) for g in got] == [40, 40] and len(set(got[0]) | set(got[1])) == 80
    assert "leaving 8 unseen" in caplog.text


def test_merged_counts_is_the_round_robin_prefix():
    lengths = [3, 0, 5, 1]
    order = [w for r in range(max(lengths)) for w in range(len(lengths)) if r < lengths[w]]
    for taken in range(sum(lengths) + 1):
        assert merged_counts(lengths, taken) == [order[:taken].count(w) for w in range(len(lengths))]


def test_shards_data_set_kind_and_errors(fashion, shards):
    _, taxonomy, _ = fashion
    ds = build_dataset("shards", "train", taxonomy, {"shards": str(shards.parent)})  # <folder>/<split>/
    assert isinstance(ds, ShardDataset) and len(ds) == N_IMAGES
    pattern = str(shards.parent / "{split}" / "shard-{000000..000002}.tar")
    assert len(build_dataset("shards", "train", taxonomy, {"shards": pattern})) == 24
    with pytest.raises(ValueError, match=r"data\.options\.shards"):
        build_dataset("shards", "train", taxonomy, {})
    with pytest.raises(FileNotFoundError, match=r"shard-000098\.tar"):
        ShardDataset(str(shards / "shard-{000098..000099}.tar"), taxonomy)
    with pytest.raises(ValueError, match="12 shard"):
        make_loader(ShardDataset(shards, taxonomy), 2, world_size=13, rank=0)


WORKER = textwrap.dedent("""
    import json, sys, hashlib
    import torch
    import torch.distributed as dist
    from hiercls.data import make_loader
    from hiercls.data.shards import ShardDataset
    from hiercls.taxonomy import load_taxonomy

    rank, init_file, shards, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    ds = ShardDataset(shards, load_taxonomy("fashion_mnist"), buffer_size=6)
    loader = make_loader(ds, 4, shuffle=True, seed=11, rank=rank, world_size=dist.get_world_size(), num_workers=2)
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        ids = [hashlib.sha1(x.numpy().tobytes()).hexdigest() for xs, _ in loader for x in xs]
        gathered = [None, None]
        dist.all_gather_object(gathered, ids)
        epochs.append(gathered)
    if rank == 0:
        json.dump(epochs, open(out, "w"))
    dist.destroy_process_group()
""")


@pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="torch.distributed with gloo is needed")
def test_two_gloo_ranks_see_every_sample_once_per_epoch(fashion, shards, tmp_path):
    _, _, seen = fashion
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [str(tmp_path / "init"), str(shards), str(tmp_path / "out.json")]
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(r), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("distributed workers timed out")
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log
    epochs = json.loads((tmp_path / "out.json").read_text())
    for ranks in epochs:
        assert len(ranks[0]) == len(ranks[1]) == N_IMAGES // 2
        assert sorted(ranks[0] + ranks[1]) == sorted(seen)  # each image exactly once over the two ranks
    assert epochs[0][0] != epochs[1][0]  # a new order each epoch


def test_training_on_shards_resumes_bitwise_and_records_the_augment_options(fashion, shards, tmp_path):
    """The training loop on ``data.dataset: shards`` (evaluation reads the val shards by random access): a run cut
    mid-epoch and resumed ends with the uninterrupted run's weights; ``data.augment`` lands in config.yaml."""
    import yaml
    from safetensors.torch import load_file

    from hiercls.train.config import config_from_dict
    from hiercls.train.loop import train

    def recipe(out: Path, augment: object = False, **schedule: int) -> dict:
        return {
            "taxonomy": "fashion_mnist",
            "model": {"backbone": "timm:test_vit", "head": "semantic_softmax", "backbone_options": {"img_size": 16}},
            "data": {
                "dataset": "shards",
                "options": {"shards": str(shards.parent / "{split}"), "buffer_size": 4},
                "train_split": "train",
                "eval_split": "train",
                "max_eval_samples": 10,
                "batch_size": 16,
                "num_workers": 2,
                "image_size": 16,
                "augment": augment,
            },
            "optim": {"lr": 3e-3},
            "schedule": {"epochs": 2, **schedule},
            "run": {"out_dir": str(out), "progress": False, "plot": False, "seed": 5},
        }

    ref = train(config_from_dict(recipe(tmp_path / "ref")))
    assert ref["step"] == 2 * N_IMAGES // 16
    assert train(config_from_dict(recipe(tmp_path / "cut", max_steps_this_run=4)))["interrupted"]
    final = train(config_from_dict(recipe(tmp_path / "cut")))
    assert final["step"] == ref["step"]
    a, b = (load_file(str(tmp_path / r / "checkpoints" / "last" / "model.safetensors")) for r in ("ref", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    augment = {"hflip": 0.5, "interpolation": "bilinear", "scale": [0.5, 1.0]}
    assert train(config_from_dict(recipe(tmp_path / "aug", augment, max_steps_this_run=1)))["step"] == 1
    assert yaml.safe_load((tmp_path / "aug" / "config.yaml").read_text())["data"]["augment"] == augment


def test_bad_samples_name_the_shard_and_key(fashion, tmp_path):
    taxonomy = fashion[1]
    png = io.BytesIO()
    Image.new("L", (4, 4)).save(png, format="PNG")

    def shard(name: str, members: dict[str, bytes]) -> Path:
        with tarfile.open(tmp_path / name, "w") as tar:
            for member, data in members.items():
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return tmp_path / name

    bad_label = shard(
        "a.tar",
        {
            "k1.png": png.getvalue(),
            "k1.cls": b"trouser",
            "k2.png": png.getvalue(),
            "k2.json": b'{"label": "no such node"}',
        },
    )
    loader = make_loader(ShardDataset(bad_label, taxonomy), 2, shuffle=False)
    with pytest.raises(TaxonomyError, match=r"a\.tar:k2.*no such node"):
        list(loader)
    no_label = shard("b.tar", {"k1.png": png.getvalue()})
    with pytest.raises(TaxonomyError, match=r"b\.tar.*'k1' has no a \.cls or \.json label member"):
        list(make_loader(ShardDataset(no_label, taxonomy), 2, shuffle=False))
