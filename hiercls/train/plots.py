"""Training-curve plot: loss per step and per-level accuracy per evaluation, from ``metrics.jsonl``.

Example:
    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> recs = [{"type": "train", "step": 1, "loss": 2.0}, {"type": "train", "step": 2, "loss": 1.5},
    ...         {"type": "eval", "step": 2, "epoch": 0, "eval_loss": 1.6, "argmax_leaf/per_level_accuracy": [0.9, 0.5]}]
    >>> _ = (d / "m.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in recs))
    >>> plot_run(d / "m.jsonl", d / "curves.png").is_file()
    True
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["level_accuracy_keys", "plot_run", "read_log"]


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file (blank or torn last lines are skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a kill
    return out


def level_accuracy_keys(record: dict[str, Any]) -> list[str]:
    """Keys of an evaluation record holding per-depth accuracy lists (``<decoder>/per_level_accuracy``)."""
    return sorted(k for k, v in record.items() if k.split("/")[-1] == "per_level_accuracy" and isinstance(v, list))


def plot_run(log_path: str | os.PathLike[str], png_path: str | os.PathLike[str]) -> Path:
    """Write a PNG with the training/eval loss curves and the per-level accuracy of the evaluations.

    Left: training loss per logged step (and evaluation loss at each evaluation). Right: per-level accuracy
    (depth 1 = coarsest) of the last evaluation for every decoder, with earlier evaluations faded.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    records = read_log(log_path)
    train = [r for r in records if r.get("type") == "train" and r.get("loss") is not None]
    evals = [r for r in records if r.get("type") == "eval"]
    fig, (ax_loss, ax_level) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    ev = [r for r in evals if isinstance(r.get("eval_loss"), (int, float))]
    if ev:
        ax_loss.plot([r["step"] for r in ev], [r["eval_loss"] for r in ev], "o-", label="eval loss")
    ax_loss.set_xlabel("optimizer step")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("loss")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)
    if evals:
        last = evals[-1]
        for key in level_accuracy_keys(last):
            levels = list(range(1, len(last[key]) + 1))
            for old in evals[:-1]:
                if isinstance(old.get(key), list) and len(old[key]) == len(levels):
                    ax_level.plot(levels, old[key], color="grey", alpha=0.25)
            ax_level.plot(levels, last[key], "o-", label=key.rsplit("/", 1)[0])
        ax_level.set_xlabel("depth (1 = coarsest)")
        ax_level.set_ylabel("accuracy")
        ax_level.set_ylim(0, 1)
        ax_level.set_title(f"per-level accuracy (eval after step {last.get('step')})")
        if level_accuracy_keys(last):
            ax_level.legend()
        ax_level.grid(alpha=0.3)
    else:
        ax_level.set_axis_off()
    fig.tight_layout()
    png = Path(png_path)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
