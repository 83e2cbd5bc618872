"""A genuine multi-label hierarchical text set from WordNet: gloss -> all the synset's parents.

WordNet 3.0 has 2,213 noun synsets with more than one parent (hypernym or instance hypernym) in the shipped
``wordnet_nouns`` DAG: *Shakespeare* is an instance of both *dramatist* and *poet*, *actor's agent* is both an
*agent* and a *booker*. Each gives one sample: the text is the synset's definition (``data.noun``, the
Debian ``wordnet-base`` files) and the label set is its parents, every one with its whole ancestry (a DAG:
all paths). The synset itself is not a label, so the task is "what kinds of thing does this definition
describe", with genuinely several answers per text.

The taxonomy (:func:`wordnet_multilabel_taxonomy`) is ``wordnet_nouns`` restricted to the parents and their
ancestors. Splits are fixed by :func:`hiercls.data.gloss_split_of` (``sha256(wnid)``: 80/10/10).
:func:`write_wordnet_multilabel` writes the JSONL files and the taxonomy that ``recipes/wordnet_multilabel.yaml``
trains on (shipped in ``data/wordnet_multilabel/``; rebuild with
``python -m hiercls.data.wordnet_multilabel data/wordnet_multilabel``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from hiercls.data.wordnet_gloss import gloss_split_of
from hiercls.taxonomy import Taxonomy, load_taxonomy
from hiercls.taxonomy.io import write_json
from hiercls.taxonomy.wordnet import noun_glosses

__all__ = ["wordnet_multilabel_rows", "wordnet_multilabel_taxonomy", "write_wordnet_multilabel"]

SPLITS = ("train", "val", "test")


def wordnet_multilabel_rows(dag: Taxonomy | None = None, glosses: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per synset with two or more parents: ``{"id", "synset", "split", "text", "labels"}``.

    ``labels`` are the parents' wnids in WordNet's order (node names of :func:`wordnet_multilabel_taxonomy`).
    Rows are in node order of ``dag`` (default: the shipped ``wordnet_nouns``).

    Example:
        >>> rows = wordnet_multilabel_rows()  # doctest: +SKIP
        >>> next(r for r in rows if r["synset"] == "Shakespeare")["labels"]  # doctest: +SKIP
        ['n10030277', 'n10444194']
    """
    dag = dag if dag is not None else load_taxonomy("wordnet_nouns")
    glosses = glosses if glosses is not None else noun_glosses()
    rows = []
    for node in range(dag.num_nodes):
        parents = dag.parents(node)
        if len(parents) < 2:
            continue
        wnid = dag.name_of(node)
        rows.append(
            {
                "id": wnid,
                "synset": dag.display_names[node],
                "split": gloss_split_of(wnid),
                "text": glosses[wnid],
                "labels": [dag.name_of(p) for p in parents],
            }
        )
    return rows


def wordnet_multilabel_taxonomy(dag: Taxonomy | None = None, rows: list[dict[str, Any]] | None = None) -> Taxonomy:
    """``wordnet_nouns`` restricted to the label nodes of :func:`wordnet_multilabel_rows` and their ancestors."""
    dag = dag if dag is not None else load_taxonomy("wordnet_nouns")
    rows = rows if rows is not None else wordnet_multilabel_rows(dag)
    labels = sorted({w for r in rows for w in r["labels"]})
    return dag.restrict(labels).replace(
        name="wordnet_multilabel",
        metadata={
            **dict(dag.metadata),
            "name": "wordnet_multilabel",
            "description": "Parents of the WordNet 3.0 noun synsets with two or more parents, with their ancestors",
            "build_command": "python -m hiercls.data.wordnet_multilabel data/wordnet_multilabel",
            "counts": None,
        },
    )


def write_wordnet_multilabel(out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write ``train/val/test.jsonl`` (keys ``id``, ``synset``, ``text``, ``labels``) and ``taxonomy.json.gz``.

    Returns:
        ``{"train": path, "val": path, "test": path, "taxonomy": path}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dag = load_taxonomy("wordnet_nouns")
    rows = wordnet_multilabel_rows(dag)
    paths: dict[str, Path] = {}
    for split in SPLITS:
        paths[split] = out / f"{split}.jsonl"
        with open(paths[split], "w", encoding="utf-8", newline="\n") as f:
            for r in rows:
                if r["split"] == split:
                    record = {k: r[k] for k in ("id", "synset", "text", "labels")}
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
    paths["taxonomy"] = out / "taxonomy.json.gz"
    write_json(wordnet_multilabel_taxonomy(dag, rows), paths["taxonomy"])
    return paths


if __name__ == "__main__":  # pragma: no cover - the build command of the shipped files
    for name, path in write_wordnet_multilabel(sys.argv[1] if len(sys.argv) > 1 else "data/wordnet_multilabel").items():
        print(f"{name}: {path}")
