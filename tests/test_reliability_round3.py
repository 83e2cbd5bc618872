"""Reliability round 3, leftovers of issue 28: metric devices and empty computes, evaluate's split names, bounded
reads of NumPy probability files, hand-edited display names in hiercls JSON taxonomies."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import hiercls.metrics as metrics
from hiercls._textio import TextFileError, read_limit
from hiercls.cli import main
from hiercls.data import build_dataset
from hiercls.evaluation import load_labels, load_probabilities
from hiercls.evaluation.table import calibration_rows
from hiercls.taxonomy import Taxonomy, TaxonomyError, read_json, write_json

TAX = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
STATEFUL = sorted(
    name
    for name in metrics.__all__
    if isinstance(getattr(metrics, name), type)
    and issubclass(getattr(metrics, name), metrics.Metric)
    and getattr(metrics, name) is not metrics.Metric
)
# Device types torch names here (it has a torch.<type> module with is_available()) but cannot use.
UNAVAILABLE = [d for d in ("cuda", "mps", "xpu") if not getattr(torch, d).is_available()]


def test_every_stateful_metric_is_listed() -> None:
    assert {"HierarchicalMetrics", "HierarchicalFBeta", "NodeF1", "TopKMetrics", "NestedDice"} <= set(STATEFUL)


@pytest.mark.parametrize("device", UNAVAILABLE or [pytest.param("cuda", marks=pytest.mark.skip("every device works"))])
@pytest.mark.parametrize("name", STATEFUL)
def test_metric_to_an_unavailable_device_is_explained(name: str, device: str) -> None:
    # Before: torch's raw driver error ("Found no NVIDIA driver on your system ..."), naming neither.
    label = "CUDA" if device == "cuda" else device.upper()
    metric = getattr(metrics, name)(TAX)
    for move in (
        lambda: metric.to(device),
        lambda: metric.to(device=f"{device}:0"),
        lambda: metric.to(device, torch.float64),
    ):
        with pytest.raises(
            RuntimeError, match=rf"^{name}: cannot move to device '{device}(:0)?': {label} is not available"
        ):
            move()
    if device == "cuda":
        with pytest.raises(RuntimeError, match=rf"^{name}: cannot move to device 'cuda': CUDA is not available"):
            metric.cuda()
    assert metric.device == torch.device("cpu")  # nothing moved
    assert metric.to("cpu") is metric


@pytest.mark.parametrize("name", STATEFUL)
def test_compute_before_update_names_the_metric_and_the_call(name: str) -> None:
    # Before: torchmetrics's "compute called before update ... may lead to errors" warning, then a RuntimeError
    # that said "call update()" without the order of its arguments.
    metric = getattr(metrics, name)(TAX)
    want = rf"^{name}\.compute\(\) was called before any update\(\).*call {name}\.update\(preds, target\)"
    with warnings.catch_warnings():
        # torchmetrics's own "compute before update" warning may come first (hiercls keeps to its public API)
        warnings.filterwarnings("ignore", message=r"The ``compute`` method of metric", category=UserWarning)
        with pytest.raises(RuntimeError, match=want):
            metric.compute()
        with pytest.raises(RuntimeError, match=want):
            metric.results()


def test_loaded_states_compute_the_source_metrics_result() -> None:
    # torchmetrics counts update() calls, not states: a metric restored by load_state_dict may warn "compute was
    # called before update" although its states hold data; hiercls counts updates in a state, so the result is
    # the source metric's, not a refusal.
    source = metrics.HierarchicalFBeta(TAX)
    source.update(["a", "b"], ["x", "b"])
    restored = metrics.HierarchicalFBeta(TAX)
    restored.load_state_dict(source.state_dict())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"The ``compute`` method of metric", category=UserWarning)
        assert restored.compute().item() == source.compute().item() == pytest.approx(0.8)


# ---------------------------------------------------------------------------------------------- evaluate's split names
@pytest.mark.slow  # trains a tiny model (a few seconds of CPU)
def test_evaluate_an_unknown_split_is_refused_naming_the_splits(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # Before: the synthetic data set drew any split name with its own seed, so --data tset scored made-up samples.
    (tmp_path / "tax.txt").write_text("root animal\nroot vehicle\nanimal cat\nanimal dog\nvehicle car\n")
    recipe = {
        "name": "tiny",
        "taxonomy": str(tmp_path / "tax.txt"),
        "model": {"backbone": "timm:test_vit", "head": "semantic_softmax", "backbone_options": {"img_size": 16}},
        "data": {
            "dataset": "synthetic",
            "batch_size": 8,
            "image_size": 16,
            "options": {"kind": "image", "image_size": 16, "train_samples": 8, "val_samples": 8, "test_samples": 8},
        },
        "schedule": {"epochs": 1},
        "run": {"out_dir": str(tmp_path / "run"), "progress": False},
    }
    (tmp_path / "recipe.yaml").write_text(json.dumps(recipe))  # JSON is YAML
    assert main(["train", str(tmp_path / "recipe.yaml"), "--no-compare"]) == 0
    run = str(tmp_path / "run")
    capsys.readouterr()
    assert main(["evaluate", "--model", run, "--data", "test", "--decoder", "argmax_leaf"]) == 0
    assert "8 samples of split 'test'" in capsys.readouterr().out
    for extra in ([], ["--table"], ["--conformal", "0.2", "--calibration-data", "val"]):
        assert main(["evaluate", "--model", run, "--data", "tset", *extra]) != 0
        captured = capsys.readouterr()
        assert "split 'tset': the 'synthetic' data set has the splits 'train', 'val', 'test'" in captured.err
        assert "samples of split" not in captured.out


def test_every_data_set_kind_names_its_splits(tmp_path: Path) -> None:
    tax = Taxonomy([("r", "cat"), ("r", "dog")])
    (tmp_path / "images" / "train" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "val").mkdir()
    cases = [
        ("synthetic", {}, "the 'synthetic' data set has the splits 'train', 'val', 'test'"),
        ("nested_blobs_3d", {}, "the 'nested_blobs_3d' data set has the splits 'train', 'val', 'test'"),
        (
            "image_folder",
            {"root": str(tmp_path / "images")},
            "has no folder 'tset'; its splits (sub-folders): 'train', 'val'",
        ),
        (
            "text_csv",
            {"train_path": "a.csv", "text_column": "t", "label_column": "l"},
            "the recipe gives the splits 'train'",
        ),
        ("wordnet_gloss", {}, "split must be 'train', 'val', 'test' or 'all'; got 'tset'"),
        ("fashion_mnist", {}, "split must be 'train', 'test', 'train_fit' or 'val'; got 'tset'"),
    ]
    for kind, options, message in cases:
        with pytest.raises((ValueError, FileNotFoundError), match=re.escape(message)):
            build_dataset(kind, "tset", None if kind == "nested_blobs_3d" else tax, options)


# ---------------------------------------------------------------------------------------------- bounded array reads
LIMIT_HINT = (
    "over the read limit of {} bytes; if the file is meant to be this large, raise the limit "
    "(environment variable HIERCLS_MAX_READ_BYTES"
)


def test_npy_npz_pt_probabilities_obey_the_read_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: np.load / torch.load read them whole, whatever HIERCLS_MAX_READ_BYTES said.
    probs = np.full((100, 10), 0.1)  # 8,000 bytes of float64
    np.save(tmp_path / "p.npy", probs)
    np.savez(tmp_path / "p.npz", probs=probs)
    torch.save(torch.as_tensor(probs), tmp_path / "p.pt")
    np.save(tmp_path / "y.npy", np.arange(1000))
    for name in ("p.npy", "p.npz", "p.pt"):
        np.testing.assert_array_equal(load_probabilities(tmp_path / name), probs)  # under the default limit
        with read_limit(4000), pytest.raises(TextFileError, match=re.escape(LIMIT_HINT.format(4000))) as info:
            load_probabilities(tmp_path / name)
        assert str(info.value).startswith(str(tmp_path / name))
    monkeypatch.setenv("HIERCLS_MAX_READ_BYTES", "7999")
    with pytest.raises(TextFileError, match=r"y\.npy: the file holds 8128 bytes, over the read limit of 7999 bytes"):
        load_labels(tmp_path / "y.npy", TAX)
    monkeypatch.setenv("HIERCLS_MAX_READ_BYTES", "8128")
    with pytest.raises(ValueError, match="not a node id"):  # read, then checked as labels
        load_labels(tmp_path / "y.npy", TAX)


def test_npz_zip_bomb_is_refused_without_decompressing(tmp_path: Path) -> None:
    # 64 MiB of zeros deflate to 64 KiB: the members' recorded sizes are summed before anything is inflated.
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z, z.open("probs.npy", "w") as f:
        np.lib.format.write_array(f, np.zeros((1 << 20, 8)))
    assert bomb.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with (
            read_limit(1 << 20),
            pytest.raises(TextFileError, match=r"bomb\.npz: its 1 members expand to 67108992 bytes"),
        ):
            load_probabilities(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # nothing near the 64 MiB it holds


def test_npy_header_declaring_more_than_the_file_holds(tmp_path: Path) -> None:
    # Before: numpy allocated the declared shape first (MemoryError: unable to allocate 7.28 TiB), a raw traceback.
    forged = tmp_path / "forged.npy"
    with open(forged, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f8", "fortran_order": False, "shape": (1_000_000, 1_000_000)}
        )
        f.write(np.zeros(4).tobytes())
    with pytest.raises(ValueError, match=r"forged\.npy: the header declares an array of shape \[1000000, 1000000\]"):
        load_probabilities(forged)
    inner = tmp_path / "forged.npz"
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("probs.npy", forged.read_bytes())
    with pytest.raises(ValueError, match=r"forged\.npz \(member probs\.npy\): the header declares"):
        load_probabilities(inner)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_probability_files_that_are_not_regular_are_refused_by_name(tmp_path: Path) -> None:
    # Before: a FIFO or /dev/zero was "no such file".
    fifo = tmp_path / "p.npy"
    os.mkfifo(fifo)
    with pytest.raises(TextFileError, match=r"p\.npy: is a FIFO \(named pipe\), not a regular file"):
        load_probabilities(fifo)
    with pytest.raises(TextFileError, match=r"p\.npy: is a FIFO \(named pipe\), not a regular file"):
        load_labels(fifo, TAX)
    if Path("/dev/zero").exists():
        with pytest.raises(TextFileError, match="/dev/zero: is a device"):
            load_probabilities("/dev/zero")


# ---------------------------------------------------------------------------------------------- display names
def test_hand_edited_display_names_in_a_hiercls_json_file_are_refused(tmp_path: Path) -> None:
    # Before: rotating display names loaded silently (the fingerprint leaves them out) and changed every printed
    # prediction. The fingerprint stays the label-space identity: the two taxonomies below are still equal.
    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")], display_names={"x": "Cat", "y": "Dog", "b": "Car"})
    for name in ("t.json", "t.json.gz"):
        path = tmp_path / name
        write_json(tax, path)
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            obj = json.load(f)
        assert (
            obj["display_names_sha256"]
            == hashlib.sha256(
                json.dumps(
                    [["a", "a"], ["b", "Car"], ["r", "r"], ["x", "Cat"], ["y", "Dog"]], separators=(",", ":")
                ).encode()
            ).hexdigest()
        )
        assert read_json(path).display_names == ("r", "a", "Cat", "Dog", "Car")
        shown = obj["display_names"]
        shown[2], shown[3] = shown[3], shown[2]  # two leaves' display names rotated by hand
        with opener(path, "wt", encoding="utf-8") as f:
            json.dump(obj, f)
        with pytest.raises(TaxonomyError, match=re.escape(f"{path}: display names mismatch")) as info:
            read_json(path)
        assert "the display names were edited" in str(info.value)
        assert 'remove "display_names_sha256" to accept the new display names' in str(info.value)
        del obj["display_names_sha256"]  # the way to accept them
        with opener(path, "wt", encoding="utf-8") as f:
            json.dump(obj, f)
        back = read_json(path)
        assert back.display_names == ("r", "a", "Dog", "Cat", "Car") and back == tax  # same label space
    # A file that had no display names (all equal to the node names) gains some by hand: refused too.
    plain = Taxonomy([("r", "a"), ("r", "b")])
    write_json(plain, tmp_path / "plain.json")
    obj = json.loads((tmp_path / "plain.json").read_text())
    assert "display_names" not in obj
    obj["display_names"] = ["r", "b", "a"]
    (tmp_path / "plain.json").write_text(json.dumps(obj))
    with pytest.raises(TaxonomyError, match="display names mismatch"):
        read_json(tmp_path / "plain.json")
    obj["display_names_sha256"] = 7
    (tmp_path / "plain.json").write_text(json.dumps(obj))
    with pytest.raises(TaxonomyError, match='"display_names_sha256" must be a string'):
        read_json(tmp_path / "plain.json")


def test_files_without_the_display_digest_load_as_before(tmp_path: Path) -> None:
    # Files written before "display_names_sha256" existed (the shipped ones were, until rebuilt) carry no digest.
    for name in ("cifar100", "brats"):
        shipped = Path(__file__).resolve().parent.parent / "taxonomies" / f"{name}.json.gz"
        obj = json.loads(gzip.decompress(shipped.read_bytes()))
        del obj["display_names_sha256"]
        path = tmp_path / f"{name}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(obj).encode()))
        assert "display_names" in obj
        assert read_json(path).display_names == tuple(obj["display_names"])


def test_calibration_split_file_is_read_within_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: evaluate --calibration-split FILE read the index file with np.load / np.loadtxt, past any limit and
    # from a FIFO (which blocks without a writer).
    rows = tmp_path / "cal.txt"
    rows.write_text("# calibration rows\n0\n2\n4\n")
    np.save(tmp_path / "cal.npy", np.array([1, 3]))
    assert calibration_rows(rows, 6)[0].tolist() == [0, 2, 4]
    assert calibration_rows(tmp_path / "cal.npy", 6)[0].tolist() == [1, 3]
    monkeypatch.setenv("HIERCLS_MAX_READ_BYTES", "8")
    for path in (rows, tmp_path / "cal.npy"):
        with pytest.raises(TextFileError, match="over the read limit"):
            calibration_rows(path, 6)
    monkeypatch.delenv("HIERCLS_MAX_READ_BYTES")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TextFileError, match=r"FIFO|fifo|not a regular"):
        calibration_rows(fifo, 6)
