"""Running a saved model on raw inputs: what ``hiercls predict`` and the ``transformers`` pipeline stand on.

A *model folder* (``config.json`` + ``model.safetensors``, from ``save_pretrained``), a training *run folder*
(``config.yaml`` + ``checkpoints/{best,last}``) or a *study folder* (``study.json`` + ``runs/<head>-seed<k>/``, what
``hiercls train`` writes for a recipe with ``study.seeds``: its best run, :func:`study_best_run`) can be given
wherever a saved model is expected (:func:`resolve_model_dir`). :func:`predict` decodes on the model's device;
:func:`write_predictions` writes its results.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError
from torch import nn
from tqdm.auto import tqdm

from hiercls._checks import check_choice
from hiercls._textio import atomic_write, read_text
from hiercls.data.images import IMAGE_EXTENSIONS, image_transform
from hiercls.data.text import TextRow, text_rows
from hiercls.decode import DecoderSpec, parse_decoder
from hiercls.models.card import DEFAULT_DECODER
from hiercls.models.classifier import move_to_device
from hiercls.models.files import read_json_file
from hiercls.taxonomy import Taxonomy

logger = logging.getLogger(__name__)

__all__ = [
    "INPUT_FILE_SUFFIXES",
    "PREDICTION_FORMATS",
    "InputRows",
    "check_prediction_path",
    "looks_like_path",
    "predict",
    "read_input_rows",
    "read_inputs",
    "resolve_model_dir",
    "study_best_run",
    "write_predictions",
]

#: The report a study writes into its folder; its ``"best_run"`` names the run that stands for the study.
STUDY_FILE = "study.json"


def resolve_model_dir(path: str | os.PathLike[str], which: str = "best") -> tuple[Path, Path | None]:
    """The model folder for ``path`` and the recipe (``config.yaml``) of its training run when there is one.

    ``path`` may be a run folder (its ``checkpoints/<which>``, falling back to ``last``), a checkpoint folder
    inside a run, a study folder (its best run, :func:`study_best_run`, logged at INFO level; ``hiercls evaluate``
    and ``predict`` print it) or any ``save_pretrained`` folder.

    Raises:
        FileNotFoundError: nothing loadable at ``path`` (the message says what was looked for), or a study
            folder that records no best run (the message lists its runs).

    Example:
        >>> import tempfile
        >>> from hiercls.models import create_model
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> folder = create_model("timm:resnet10t", tax, head="flat").save_pretrained(tempfile.mkdtemp())
        >>> resolve_model_dir(folder) == (Path(folder), None)
        True
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"model {str(p)!r} does not exist")
    if (p / "config.json").is_file():
        run = p.parent.parent if p.parent.name == "checkpoints" else None
        return p, _recipe(run)
    best = study_best_run(p)
    if best is not None:
        p, why = best
        logger.info("%s", why)
    for name in (which, "last", "best"):
        d = p / "checkpoints" / name
        if (d / "config.json").is_file():
            return d, _recipe(p)
    raise FileNotFoundError(
        f"{str(p)!r} is neither a saved model (config.json + model.safetensors), a run folder "
        "with checkpoints/best or checkpoints/last, nor a study folder (study.json + runs/)"
    )


def study_best_run(path: str | os.PathLike[str]) -> tuple[Path, str] | None:
    """The best run of a study folder and a line saying which and why; ``None`` if ``path`` is no study folder.

    A study (:func:`hiercls.train.run_study`) records in ``study.json`` the run whose best checkpoint scored
    highest on the recipe's ``data.eval_split`` (the split that picked every run's checkpoint, not the split the
    study reports on), as ``"best_run": {"run": "runs/<head>-seed<k>", "metric", "value", "split", ...}``.

    Raises:
        FileNotFoundError: ``path`` holds study runs (``runs/*/config.yaml``) but no recorded best run (the
            study did not finish, or was written before studies recorded one); the message lists the runs.

    Example:
        >>> import json, tempfile
        >>> study = Path(tempfile.mkdtemp())
        >>> (study / "runs" / "flat-seed0").mkdir(parents=True)
        >>> _ = (study / "study.json").write_text(json.dumps({"best_run": {"run": "runs/flat-seed0",
        ...     "metric": "argmax_leaf/hF1_micro", "value": 0.5, "split": "val", "of": 2}}))
        >>> run, why = study_best_run(study)
        >>> run == study / "runs" / "flat-seed0"
        True
        >>> print(why)
        /... is a study: using its best run /.../runs/flat-seed0 (best argmax_leaf/hF1_micro on split val:
        0.5000 of 2 runs; give a run folder to choose another)
    """
    p = Path(path)
    if (p / "config.json").is_file() or (p / "checkpoints").is_dir():
        return None  # a model or run folder
    report = p / STUDY_FILE
    runs = sorted(d for d in (p / "runs").glob("*") if (d / "config.yaml").is_file() or (d / "checkpoints").is_dir())
    if not report.is_file() and not runs:
        return None
    best = read_json_file(report, "study report").get("best_run") if report.is_file() else None
    if not best or not (p / best["run"]).is_dir():
        listed = ", ".join(str(d) for d in runs) or "(none)"
        why = "has no best run recorded" if report.is_file() else f"has no {STUDY_FILE} (the study did not finish)"
        raise FileNotFoundError(f"{str(p)!r} is a study folder that {why}; give one of its runs: {listed}")
    run = p / best["run"]
    why = (
        f"{p} is a study: using its best run {run} (best {best['metric']} on split {best['split']}: "
        f"{best['value']:.4f} of {best['of']} runs; give a run folder to choose another)"
    )
    return run, why


def _recipe(run: Path | None) -> Path | None:
    return run / "config.yaml" if run is not None and (run / "config.yaml").is_file() else None


#: Suffixes of the files ``hiercls predict`` reads (images too): an argument ending in one names a file, not a text.
INPUT_FILE_SUFFIXES = (".txt", ".csv", ".jsonl", ".json", ".tsv", ".gz", *IMAGE_EXTENSIONS)


@dataclass
class InputRows:
    """What :func:`read_input_rows` makes of command-line inputs.

    Attributes:
        inputs: the model inputs (texts, or image paths opened batch by batch in :func:`predict`).
        shown: how each input is printed (the text, or the image path).
        rows: each input's row id, to join predictions back: ``file:line`` for a row of a text file, the path of
            an image, ``arg:k`` for the k-th command-line text.
        kind: ``"text"`` or ``"image"``.
        skipped: ``(row id, problem)`` of each row left out (``on_error="skip"``).
        total: the number of rows read, skipped ones included.
    """

    inputs: list[Any] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)
    kind: str = "text"
    skipped: list[tuple[str, str]] = field(default_factory=list)
    total: int = 0

    def add(self, x: Any, shown: str, row: str) -> None:
        self.inputs.append(x)
        self.shown.append(shown)
        self.rows.append(row)
        self.total += 1


def looks_like_path(item: str) -> bool:
    """An argument that names a file: one word with a path separator or an input file's suffix.

    Example:
        >>> looks_like_path("notes.txt"), looks_like_path("data/x"), looks_like_path("a cat/dog hybrid")
        (True, True, False)
    """
    if not item or any(ch.isspace() for ch in item):
        return False
    return "/" in item or os.sep in item or item.lower().endswith(INPUT_FILE_SUFFIXES)


def read_input_rows(items: Sequence[str], *, text_column: str = "text", on_error: str = "fail") -> InputRows:
    """Turn command-line inputs into model inputs, each with a row id (:class:`InputRows`), in input order.

    * a folder -> every image file under it, in sorted order;
    * an image file (by extension) -> its path;
    * a ``.txt`` file -> one text per non-empty line (``file:line``);
    * a ``.csv`` / ``.jsonl`` file -> the ``text_column`` of each row (``file:line``, the line a row starts on);
    * a word with a path separator or a file suffix (``notes.txt``) that is no file, or another file -> an error;
    * anything else -> a text string (``arg:k``).

    A row that cannot be used (a short CSV row, an empty text) is an error naming it, or with ``on_error="skip"``
    left out and listed in ``skipped``.

    Raises:
        FileNotFoundError: a missing file. ValueError: no inputs, mixed kinds, or an unusable row (file and line
            named).

    Example:
        >>> r = read_input_rows(["a cat", "a dog"])
        >>> r.inputs, r.rows
        (['a cat', 'a dog'], ['arg:1', 'arg:2'])
    """
    on_error = check_choice(on_error, ("fail", "skip"), "on_error")
    out, kinds = InputRows(), set()
    for k, item in enumerate(items, start=1):
        p = Path(item)
        if p.is_dir():
            images = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS)
            if not images:
                raise ValueError(f"folder {item!r} holds no image files ({', '.join(IMAGE_EXTENSIONS)})")
            for f in images:
                out.add(f, str(f), str(f))
            kinds.add("image")
        elif p.suffix.lower() in IMAGE_EXTENSIONS:
            if not p.is_file():
                raise FileNotFoundError(f"image {item!r} does not exist")
            out.add(p, str(p), str(p))
            kinds.add("image")
        elif p.is_file() and p.suffix.lower() == ".txt":
            for line, text in enumerate(read_text(p, "input list").splitlines(), start=1):
                if text.strip():
                    out.add(text.strip(), text.strip(), f"{item}:{line}")
            kinds.add("text")
        elif p.is_file() and p.name.lower().endswith((".csv", ".jsonl", ".csv.gz", ".jsonl.gz")):
            _add_file_rows(out, item, text_rows(p, text_column), on_error)
            kinds.add("text")
        elif looks_like_path(item) or p.is_file():
            what = "not a kind of file" if p.exists() else "no such file"
            raise FileNotFoundError(
                f"input {item!r}: {what} to read texts or images from (.txt, .csv, .jsonl, images or a folder of "
                "images); a word with a path separator or a file suffix, or the name of a file, is read as a file, "
                "not as a text"
            )
        else:
            out.add(item, item, f"arg:{k}")
            kinds.add("text")
    if len(kinds) > 1:
        raise ValueError("inputs mix image files and texts; give one kind per call")
    if not out.inputs:
        raise ValueError("no inputs (give texts, a .txt/.csv/.jsonl file of texts, image files or a folder of images)")
    out.kind = kinds.pop()
    return out


def _add_file_rows(out: InputRows, item: str, rows: Sequence[TextRow], on_error: str) -> None:
    for r in rows:
        if not r.problem:
            out.add(r.text, r.text, f"{item}:{r.line}")
        elif on_error == "skip":
            out.skipped.append((f"{item}:{r.line}", r.problem))
            out.total += 1
        else:
            raise ValueError(f"{item}:{r.line}: {r.problem} (--on-error skip leaves such rows out)")


def read_inputs(items: Sequence[str], *, text_column: str = "text") -> tuple[list[Any], list[str], str]:
    """``(inputs, labels for display, kind)`` of :func:`read_input_rows` (unusable rows are errors).

    Example:
        >>> read_inputs(["a cat", "a dog"])
        (['a cat', 'a dog'], ['a cat', 'a dog'], 'text')
    """
    rows = read_input_rows(items, text_column=text_column)
    return rows.inputs, rows.shown, rows.kind


def _open_image(x: Any) -> Any:
    if isinstance(x, (str, os.PathLike)):
        try:
            with Image.open(x) as im:
                return im.convert("RGB")
        except (OSError, UnidentifiedImageError) as err:
            raise ValueError(f"{x}: not a readable image ({err})") from None
    return x


def _node(taxonomy: Taxonomy, j: int, prob: float) -> dict[str, Any]:
    return {"id": j, "name": taxonomy.names[j], "display_name": taxonomy.display_names[j], "prob": prob}


def _set_prediction(taxonomy: Taxonomy, in_set: torch.Tensor, probs: torch.Tensor) -> tuple[dict[str, Any], int]:
    """A node set's prediction dict (host tensors ``[N]``) and the node its path leads to."""
    depth = taxonomy.depth
    ids = [j for j in in_set.nonzero().flatten().tolist() if j != taxonomy.root]
    ids.sort(key=lambda j: (int(depth[j]), j))  # root -> deepest, as the path reads
    members = set(ids)
    tips = [j for j in ids if not members.intersection(taxonomy.children(j))]
    # the node the set is sure of: the lowest common ancestor of its tips (the root for an empty set)
    sure = functools.reduce(lambda a, b: int(taxonomy.lca(a, b)), tips) if tips else taxonomy.root
    prediction = {
        "ids": ids,
        "names": [taxonomy.names[j] for j in ids],
        "display_names": [taxonomy.display_names[j] for j in ids],
        "size": len(ids),
        "depth": int(max((depth[j] for j in ids), default=0)),
        "tips": [_node(taxonomy, j, float(probs[j])) for j in tips],
        "common": _node(taxonomy, sure, float(probs[sure])),
    }
    return prediction, sure


def _check_inputs(model: nn.Module, inputs: Sequence[Any]) -> str:
    """The model's modality, after checking that the inputs are of that kind."""
    if not inputs:
        raise ValueError("predict: no inputs")
    modality = getattr(model, "modality", "text" if isinstance(inputs[0], str) else "image")
    if modality == "text" and not all(isinstance(x, str) for x in inputs):
        raise ValueError("this is a text model: give text inputs")
    if modality == "image" and any(isinstance(x, str) and not Path(x).is_file() for x in inputs):
        raise ValueError("this is an image model: give images or image files")
    return modality


@torch.no_grad()
def predict(
    model: nn.Module,
    taxonomy: Taxonomy,
    inputs: Sequence[Any],
    *,
    decoder: str | DecoderSpec | Callable[[Any, Taxonomy], Any] = DEFAULT_DECODER,
    top_k: int = 5,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    image_size: int | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Predictions for raw inputs: texts, PIL images or image file paths.

    The node probabilities stay on ``device``: the decoder and the top-k run there, and only the decisions and
    the probabilities shown come to the host.

    Args:
        model: a trained model (:func:`hiercls.train.load_trained_model`).
        taxonomy: its taxonomy.
        inputs: texts for a text model; PIL images or image paths for an image model.
        decoder: a decoder spec (:func:`hiercls.decode.parse_decoder`); set-valued decoders (``optimal_hf1``)
            give node sets. Or a function ``fn(node_probs, taxonomy)`` returning node ids or closed node sets,
            e.g. a fitted conformal calibrator's :meth:`~hiercls.conformal.ConformalCalibrator.as_decoder`.
        top_k: how many of the most probable leaves to list.
        batch_size: inputs per forward pass.
        device: where the model runs.
        image_size: resize images to this side (default: the model's data config).
        progress: show a progress bar (stderr).

    Returns:
        Per input ``{"prediction": ..., "path": [display names root -> node], "top_k": [{"name",
        "display_name", "prob"}] (leaves)}``. A single-node prediction is ``{"id", "name", "display_name",
        "prob"}``; a node set is ``{"ids", "names", "display_names", "size", "depth", "tips", "common"}``: its
        nodes root-first, ``depth`` its deepest node's, ``tips`` its nodes without a child in the set and ``common``
        the lowest common ancestor of the tips, the node the set is sure of (each ``{"id", "name",
        "display_name", "prob"}``); ``path`` leads to ``common``.

    Example:
        >>> from hiercls.models import create_model
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> model = create_model("timm:resnet10t", tax, head="flat")
        >>> from PIL import Image
        >>> [p] = predict(model, tax, [Image.new("RGB", (32, 32))], top_k=2)
        >>> sorted(p), p["path"][0], len(p["top_k"])
        (['path', 'prediction', 'top_k'], 'r', 2)
    """
    spec = parse_decoder(decoder) if isinstance(decoder, (str, DecoderSpec)) else decoder
    modality = _check_inputs(model, inputs)
    transform = image_transform(model, train=False, image_size=image_size) if modality == "image" else None
    dev = torch.device(device)
    leaf_ids = taxonomy.leaves.tolist()
    leaves = torch.tensor(leaf_ids, dtype=torch.long, device=dev)
    k = max(1, min(top_k, len(leaf_ids)))
    names, disp = taxonomy.names, taxonomy.display_names
    out: list[dict[str, Any]] = []
    model.eval()
    bar = tqdm(
        total=len(inputs), desc="predict", unit="input", disable=None if progress else True, leave=False
    )  # None: a terminal only
    for start in range(0, len(inputs), batch_size):
        chunk = list(inputs[start : start + batch_size])
        x, _ = model.collate([(transform(_open_image(v)) if transform is not None else v, 0) for v in chunk])
        probs = model.node_probs(model(move_to_device(x, dev))).float()
        pred = torch.as_tensor(spec(probs, taxonomy), device=probs.device)
        top_p, top_i = (t.cpu() for t in probs.index_select(1, leaves).topk(k, dim=1))
        if pred.dim() == 2:  # node sets: their tips' and common nodes' probabilities are shown
            pred, shown = pred.cpu(), probs.cpu()
        else:
            pred, shown = pred.cpu(), probs.gather(1, pred.long()[:, None]).squeeze(1).cpu()
        for i in range(len(chunk)):
            if pred.dim() == 2:
                prediction, deepest = _set_prediction(taxonomy, pred[i], shown[i])
            else:
                deepest = int(pred[i])
                prediction = _node(taxonomy, deepest, float(shown[i]))
            path = [disp[j] for j in taxonomy.path(deepest)] if taxonomy.is_tree else [disp[deepest]]
            ranked = [
                {"name": names[leaf_ids[j]], "display_name": disp[leaf_ids[j]], "prob": float(p)}
                for p, j in zip(top_p[i].tolist(), top_i[i].tolist(), strict=True)
            ]
            out.append({"prediction": prediction, "path": path, "top_k": ranked})
        bar.update(len(chunk))
    bar.close()
    return out


PREDICTION_FORMATS = (".json", ".jsonl", ".csv")


def check_prediction_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path if its suffix names a prediction format (:data:`PREDICTION_FORMATS`).

    Raises:
        ValueError: another suffix.
    """
    out = Path(path)
    if out.suffix.lower() not in PREDICTION_FORMATS:
        raise ValueError(f"--out {str(out)!r}: the suffix must be one of {', '.join(PREDICTION_FORMATS)}")
    return out


def write_predictions(
    path: str | os.PathLike[str],
    shown: Sequence[str],
    predictions: Sequence[dict[str, Any]],
    *,
    rows: Sequence[str] | None = None,
    **meta: Any,
) -> Path:
    """Write :func:`predict`'s results, in the format of ``path``'s suffix, atomically (no half-written file).

    * ``.json``: ``{**meta, "predictions": [{"input", **prediction}]}``;
    * ``.jsonl``: one ``{"input", **prediction}`` object per line;
    With ``rows`` (the row ids of :func:`read_input_rows`) every prediction starts with its ``row``, to join the
    predictions back onto the inputs.

    * ``.csv``: columns ``[row,] input, name, display_name, prob, set_size, path, top_k`` (``name`` is the
      predicted node, or a set's nodes joined by ``|``; ``prob`` that node's probability, or a set's common
      node's; ``path`` the display names joined by `` > ``; ``top_k`` ``name:prob`` pairs joined by ``|``).

    Raises:
        ValueError: an unknown suffix; OSError: ``path`` cannot be written (see
            :func:`hiercls._textio.atomic_write`).
    """
    out = check_prediction_path(path)
    suffix = out.suffix.lower()
    ids = [{"row": r} for r in rows] if rows is not None else [{}] * len(shown)
    if len(ids) != len(shown):
        raise ValueError(f"rows has {len(ids)} ids for {len(shown)} inputs")
    records = [{**i, "input": s, **p} for i, s, p in zip(ids, shown, predictions, strict=True)]
    if suffix == ".json":
        text = json.dumps({**meta, "predictions": records}, indent=2, ensure_ascii=False) + "\n"
    elif suffix == ".jsonl":
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    else:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        head = ["row"] if rows is not None else []
        writer.writerow([*head, "input", "name", "display_name", "prob", "set_size", "path", "top_k"])
        for r in records:
            pr = r["prediction"]
            one = pr.get("common", pr)
            writer.writerow(
                [
                    *([r["row"]] if rows is not None else []),
                    r["input"],
                    "|".join(pr["names"]) if "names" in pr else pr["name"],
                    "|".join(pr["display_names"]) if "names" in pr else pr["display_name"],
                    f"{one['prob']:.6g}",
                    pr.get("size", 1),
                    " > ".join(r["path"]),
                    "|".join(f"{t['name']}:{t['prob']:.6g}" for t in r["top_k"]),
                ]
            )
        text = buf.getvalue()
    with atomic_write(out, "w", encoding="utf-8") as f:
        f.write(text)
    return out
