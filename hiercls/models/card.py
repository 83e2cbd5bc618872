"""The model card (``README.md``) that :meth:`HierarchicalClassifier.save_pretrained` writes next to the weights.

It states what a reader of the folder needs before using the model: the taxonomy (name, size, fingerprint), the
backbone, the head and its options, the decoder that ``hiercls predict`` and the pipeline use by default, the
metrics of the evaluation the weights were saved after (when the caller passes them) and how to load it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_DECODER", "model_card"]

DEFAULT_DECODER = "argmax_leaf"
"""The decoder of ``hiercls predict``, :func:`hiercls.models.inference.predict` and the pipeline."""


def model_card(config: Mapping[str, Any], taxonomy: Any, metrics: Mapping[str, Any] | None = None) -> str:
    """The Markdown model card of a saved model.

    Args:
        config: the model's ``config.json`` content (:meth:`HierarchicalClassifier.config`).
        taxonomy: its taxonomy.
        metrics: evaluation results keyed ``"<decoder>/<metric>"`` (:class:`hiercls.evaluation.Evaluator`), or
            ``None`` for a card without a metrics table.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")], name="toy")
        >>> card = model_card({"backbone": "timm:resnet10t", "head": "flat", "head_options": {}}, tax,
        ...                   {"argmax_leaf/accuracy": 0.5, "argmax_leaf/hF1_micro": 0.75})
        >>> print(card.splitlines()[5])
        # toy hierarchical classifier (flat head)
        >>> "| argmax_leaf | 0.5000 | 0.7500 |" in card
        True
    """
    fp = str(getattr(taxonomy, "fingerprint", config.get("taxonomy_fingerprint", "")))
    options = json.dumps(config.get("head_options") or {}, ensure_ascii=False)
    lines = [
        "---",
        "library_name: hiercls",
        "tags: [hiercls, hierarchical-classification]",
        "pipeline_tag: hierarchical-classification",
        "---",
        f"# {taxonomy.name} hierarchical classifier ({config['head']} head)",
        "",
        "| | |",
        "|---|---|",
        f"| taxonomy | {taxonomy.name}: {taxonomy.num_nodes} nodes, {taxonomy.num_leaves} leaves, height "
        f"{taxonomy.height}, {'tree' if taxonomy.is_tree else 'DAG'}; fingerprint `{fp[:16]}` |",
        f"| backbone | `{config['backbone']}` |",
        f"| head | `{config['head']}` with options `{options}` |",
        f"| default decoder | `{DEFAULT_DECODER}` (any `hiercls.decode` spec can be passed instead) |",
        "",
    ]
    table: dict[str, dict[str, Any]] = {}  # decoder -> metric -> value, decoders in first-seen order
    for key, value in (metrics or {}).items():
        decoder, _, name = key.rpartition("/")
        if decoder:
            table.setdefault(decoder, {})[name] = value
    names = ("accuracy", "hF1_micro", "hF1_samples", "hF1_macro", "mistake_severity", "top1_accuracy")
    shown = [n for n in names if any(n in row for row in table.values())]
    if shown:
        lines += [
            "## Metrics",
            "",
            "On the evaluation these weights were saved after (`accuracy` is the exact match; hF1 as in "
            "hiercls's docs/metrics.md).",
            "",
            "| decoder | " + " | ".join(shown) + " |",
            "|---" * (len(shown) + 1) + "|",
        ]
        for d, row in table.items():
            lines.append(f"| {d} | " + " | ".join(_cell(row.get(n)) for n in shown) + " |")
        lines.append("")
    lines += [
        "## Use",
        "",
        "```python",
        "from hiercls.models import HierarchicalClassifier",
        'model = HierarchicalClassifier.from_pretrained("path/to/this/folder").eval()',
        "# or, with transformers (offline; no remote code): import hiercls, then",
        '# transformers.AutoModel.from_pretrained("path/to/this/folder")',
        "```",
        "",
        "Files: `model.safetensors` (weights), `config.json` (backbone, head, taxonomy fingerprint), "
        "`taxonomy.json.gz` (the taxonomy)"
        + (", `backbone/` and the tokenizer files (the text encoder)" if config.get("modality") == "text" else "")
        + ".",
        "",
    ]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "—"
