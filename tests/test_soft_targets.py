"""Soft targets (a leaf distribution ``[B, L]`` or node marginals ``[B, N]``) in every head's loss.

Oracles: the hard-target loss on one-hot targets (values and gradients), the expectation of the hard loss over
a mixture (for the losses linear in the one-hot target), and the ImageNet-21K semantic-softmax loss with
per-level label smoothing written from its formula (Ridnik et al. 2021, Alibaba-MIIL's ``SemanticSoftmaxLoss``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _generators import random_tree, star, tree_with_classes

from hiercls.heads import create_head, list_heads
from hiercls.losses import HXELoss, SoftLabelLoss
from hiercls.models.prompt_pool import HierarchicalPromptPool
from hiercls.train.config import ConfigError, MixupConfig, apply_overrides, config_from_dict
from hiercls.train.loop import train
from hiercls.train.targets import SoftTargets

D = 6
# Every registered head with the options worth covering; a head registered without an entry here fails.
HEAD_CASES: dict[str, list[dict]] = {
    "flat": [{}, {"label_smoothing": 0.1}],
    "hxe": [{}, {"alpha": 0.5, "normalize": False}],
    "soft_labels": [{"beta": 3.0}, {"beta": 2.0, "kind": "shortest_path"}],
    "semantic_softmax": [
        {},
        {"label_smoothing": 0.0, "normalize": "present"},
        {"drop_deepest_level": True, "normalize": "present"},
    ],
    "conditional_softmax": [{}, {"stop": True}, {"huffman_counts": "counts"}],
    "multilabel": [{}, {"coherent": True}, {"pos_weight": 2.0}],
    "nested_sigmoid": [{"loss": "bce"}, {}],
}


def _cases() -> list[tuple[str, dict]]:
    return [(name, opts) for name in sorted(HEAD_CASES) for opts in HEAD_CASES[name]]


def test_every_registered_head_is_covered() -> None:
    assert set(list_heads()) <= set(HEAD_CASES), sorted(set(list_heads()) - set(HEAD_CASES))


def _taxonomy(name: str):
    return tree_with_classes(23, 4) if name == "semantic_softmax" else random_tree(23, 3)


def _head(name: str, opts: dict, tax, dtype: torch.dtype):
    opts = dict(opts)
    if opts.get("huffman_counts") == "counts":
        opts["huffman_counts"] = np.arange(1, tax.num_leaves + 1, dtype=float)
    torch.manual_seed(0)
    return create_head(name, tax, D, **opts).to(dtype)


def _hard_and_onehot(tax, b: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Leaf labels ``[B]`` (one ignored) and the same as one-hot rows ``[B, L]`` (the ignored row all -1)."""
    rng = np.random.default_rng(seed)
    pos = rng.integers(0, tax.num_leaves, b)
    hard = torch.as_tensor(tax.leaves[pos])
    soft = torch.nn.functional.one_hot(torch.as_tensor(pos), tax.num_leaves).to(dtype)
    hard[1], soft[1] = -1, -1.0
    return hard, soft


def _loss_and_grad(head, x: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    head.zero_grad()
    x = x.clone().requires_grad_(True)
    loss = head.loss(head(x), targets)
    loss.backward()
    return loss.detach(), [x.grad, *(p.grad for p in head.parameters())]


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-6), (torch.float32, 1e-5)])
@pytest.mark.parametrize(("name", "opts"), _cases())
def test_soft_loss_on_one_hot_equals_hard_loss(name: str, opts: dict, dtype: torch.dtype, tol: float) -> None:
    tax = _taxonomy(name)
    head = _head(name, opts, tax, dtype)
    x = torch.randn(7, D, dtype=dtype, generator=torch.Generator().manual_seed(1))
    hard, soft = _hard_and_onehot(tax, 7, dtype)
    want, want_grads = _loss_and_grad(head, x, hard)
    got, got_grads = _loss_and_grad(head, x, soft)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


# MCLoss and soft Dice (the nested head's default "bce+dice") are not linear in the target.
LINEAR = [c for c in _cases() if not c[1].get("coherent") and c != ("nested_sigmoid", {})]


@pytest.mark.parametrize(("name", "opts"), LINEAR)
def test_soft_loss_of_a_mixture_is_the_expected_hard_loss(name: str, opts: dict) -> None:
    # Mixup's target lam * onehot(a) + (1 - lam) * onehot(b): the losses linear in the one-hot target give
    # lam * loss(a) + (1 - lam) * loss(b) (the batch mean is linear too when no row is ignored).
    tax = _taxonomy(name)
    head = _head(name, opts, tax, torch.float64)
    out = head(torch.randn(5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2)))
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, tax.num_leaves, 5), rng.integers(0, tax.num_leaves, 5)
    lam = 0.3
    eye = torch.eye(tax.num_leaves, dtype=torch.float64)
    mixed = lam * eye[a] + (1 - lam) * eye[b]
    loss_a, loss_b = (head.loss(out, torch.as_tensor(tax.leaves[c])) for c in (a, b))
    want = lam * loss_a + (1 - lam) * loss_b
    torch.testing.assert_close(head.loss(out, mixed), want, rtol=1e-9, atol=1e-12)


def _miil_semantic_loss(tax, logits: torch.Tensor, leaf_ids: np.ndarray, eps: float) -> torch.Tensor:
    """The published per-level loss, from its formula: per level ``l`` with ``n_l`` classes, target
    ``(1 - eps) onehot + eps / n_l`` where the sample has a level-``l`` class (else 0), cross-entropy summed over
    classes, mean over the batch, weighted by ``min(C / #classes at levels >= l, 20)``, summed over levels."""
    classes = tax.classes
    level = tax.semantic_level
    num_levels = int(level[classes].max()) + 1
    per_level = [sorted(int(c) for c in classes if level[c] == k) for k in range(num_levels)]
    total, start = torch.zeros((), dtype=logits.dtype), 0
    for k, members in enumerate(per_level):
        n = len(members)
        weight = min(len(classes) / sum(len(m) for m in per_level[k:]), 20.0)
        logp = torch.log_softmax(logits[:, start : start + n], 1)
        start += n
        rows = []
        for i, y in enumerate(leaf_ids):
            anc = [int(a) for a in tax.paths[y] if a >= 0 and int(a) in members]
            if not anc:
                rows.append(torch.zeros((), dtype=logits.dtype))
                continue
            target = torch.full((n,), eps / n, dtype=logits.dtype)
            target[members.index(anc[0])] += 1 - eps
            rows.append(-(target * logp[i]).sum())
        total = total + weight * torch.stack(rows).mean()
    return total


@pytest.mark.parametrize("eps", [0.2, 0.0])
def test_semantic_soft_loss_equals_the_published_label_smoothed_loss(eps: float) -> None:
    tax = tree_with_classes(31, 7)
    head = create_head("semantic_softmax", tax, D, label_smoothing=eps).double()
    out = head(torch.randn(9, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3)))
    pos = np.random.default_rng(1).integers(0, tax.num_leaves, 9)
    soft = torch.eye(tax.num_leaves, dtype=torch.float64)[pos]
    want = _miil_semantic_loss(tax, out, tax.leaves[pos], eps)
    torch.testing.assert_close(head.loss(out, soft), want, rtol=1e-10, atol=1e-12)


def test_soft_labels_without_the_table_match_the_table() -> None:
    # Label smoothing leaves a floor on every leaf and mixup two leaves above it: both branches of the tableless
    # mixture against the [N, L] table.
    tax = random_tree(40, 11)
    with_table, without = SoftLabelLoss(tax, beta=4.0), SoftLabelLoss(tax, beta=4.0, table_limit=0)
    assert with_table.use_table and not without.use_table
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, tax.num_leaves, 6), rng.integers(0, tax.num_leaves, 6)
    eye = torch.eye(tax.num_leaves, dtype=torch.float64)
    r = 0.9 * (0.6 * eye[a] + 0.4 * eye[b]) + 0.1 / tax.num_leaves
    for mix in (r, 0.6 * eye[a] + 0.4 * eye[b]):  # with and without the floor
        torch.testing.assert_close(
            without.mixed_soft_targets(mix), with_table.mixed_soft_targets(mix), rtol=1e-6, atol=1e-7
        )
    logits = torch.randn(6, tax.num_leaves, dtype=torch.float64)
    torch.testing.assert_close(without(logits, r), with_table(logits, r), rtol=1e-6, atol=1e-7)


def test_node_based_heads_take_node_marginals() -> None:
    tax = random_tree(15, 2)
    hard, soft = _hard_and_onehot(tax, 5, torch.float64)
    marg = torch.as_tensor(tax.marginals(soft.clamp(min=0).numpy()))
    marg[1] = -1.0
    for name in ("multilabel", "nested_sigmoid"):
        head = _head(name, {}, tax, torch.float64)
        out = head(torch.randn(5, D, dtype=torch.float64))
        torch.testing.assert_close(head.loss(out, marg), head.loss(out, hard), rtol=1e-9, atol=1e-12)


def test_prompt_pool_soft_loss_on_one_hot_equals_hard_loss() -> None:
    tax = random_tree(25, 8)
    pool = HierarchicalPromptPool(tax, D, [1, 2], coarse_loss_weight=0.5).double()
    g = torch.Generator().manual_seed(4)
    fine = torch.randn(7, tax.num_leaves, dtype=torch.float64, generator=g, requires_grad=True)
    coarse = {lvl: torch.randn(7, len(tax.levels[lvl]), dtype=torch.float64, generator=g) for lvl in (1, 2)}
    output = {"fine_logits": fine, "coarse_logits": coarse}
    hard, soft = _hard_and_onehot(tax, 7, torch.float64)
    got, want = pool.loss_terms(output, soft), pool.loss_terms(output, hard)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("targets", "match"),
    [
        (torch.full((2, 3), 0.5), "sums to 1.5"),
        (torch.ones(2, 4), r"shape \[2, 3\]"),
        (torch.tensor([[float("nan"), 0.5, 0.5], [1.0, 0, 0]]), "finite"),
    ],
)
def test_bad_soft_targets_are_named(targets: torch.Tensor, match: str) -> None:
    tax = star(3)
    head = create_head("flat", tax, D)
    with pytest.raises(ValueError, match=match):
        head.loss(head(torch.randn(2, D)), targets)


# ---------------------------------------------------------------------------------------------- training
TAXONOMY_LINES = ["root animal", "root vehicle", "animal cat", "animal dog", "vehicle car", "vehicle bike"]


def _recipe(tmp_path, out: str, head: str, mixup: dict, **overrides: object):
    tax = tmp_path / "tax.txt"
    tax.write_text("\n".join(TAXONOMY_LINES) + "\n", encoding="utf-8")
    data = {
        "taxonomy": str(tax),
        "model": {"backbone": "timm:test_vit", "head": head, "backbone_options": {"img_size": 16}},
        "data": {
            "dataset": "synthetic",
            "batch_size": 7,  # odd: the last sample of a micro-batch is not mixed
            "options": {"kind": "image", "image_size": 16, "train_samples": 22, "val_samples": 6},
            "mixup": mixup,
        },
        "optim": {"lr": 3e-3, "warmup_steps": 1, "grad_accum": 2},
        "schedule": {"epochs": 2},
        "eval": {"decoders": ["argmax_leaf"]},
        "run": {"out_dir": str(tmp_path / out), "progress": False, "plot": False, "seed": 5},
    }
    cfg = config_from_dict(data)
    return apply_overrides(cfg, [f"{k}={v}" for k, v in overrides.items()])


def _weights(run_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "checkpoints" / "last" / "model.safetensors"))


MIX = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "switch_prob": 0.5, "mode": "pair", "label_smoothing": 0.1}


def test_resume_with_mixup_is_bitwise_exact(tmp_path) -> None:
    ref = train(_recipe(tmp_path, "ref", "hxe", MIX))
    part = train(_recipe(tmp_path, "cut", "hxe", MIX, **{"schedule.max_steps_this_run": 1}))
    assert part["interrupted"] and part["step"] == 1
    final = train(_recipe(tmp_path, "cut", "hxe", MIX))
    assert final["step"] == ref["step"] == 4
    a, b = _weights(tmp_path / "ref"), _weights(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Mixup did change the training: the same run without it ends elsewhere.
    plain = _weights(tmp_path / "plain") if train(_recipe(tmp_path, "plain", "hxe", {})) else {}
    assert any(not torch.equal(a[k], plain[k]) for k in a)


@pytest.mark.parametrize("head", ["semantic_softmax", "multilabel"])
def test_label_smoothing_alone_trains_through_the_soft_path(tmp_path, head: str) -> None:
    out = train(_recipe(tmp_path, head, head, {"label_smoothing": 0.2}, **{"schedule.epochs": 1}))
    assert out["step"] == 2 and math.isfinite(out["train_loss"])


def test_soft_targets_ignore_partners_and_refuse_internal_labels() -> None:
    tax = random_tree(12, 1)
    leaves = torch.tensor(tax.leaves[:5].tolist())
    soft = SoftTargets(MixupConfig(mixup_alpha=1.0, mode="elem"), tax)
    targets = torch.cat([leaves[:4], torch.tensor([-1]), leaves[4:5]])  # 6 samples: 4 is ignored, mixed with 1
    _, q = soft(torch.randn(6, 3), targets)
    ignored = (q < 0).all(1).tolist()
    assert ignored == [False, True, False, False, True, False]
    kept = q[~torch.tensor(ignored)]
    torch.testing.assert_close(kept.sum(1), torch.ones(len(kept)))
    internal = int(np.flatnonzero(~tax.is_leaf)[1])
    with pytest.raises(ConfigError, match=f"node {internal}\\) is not a leaf"):
        soft(torch.randn(2, 3), torch.tensor([internal, int(leaves[0])]))


def test_mixup_config_is_checked_by_name() -> None:
    with pytest.raises(ConfigError, match=r"data.mixup.prob: must be in \[0, 1\]"):
        config_from_dict({"data": {"mixup": {"prob": 1.5}}})
    with pytest.raises(ConfigError, match="did you mean 'cutmix_alpha'"):
        config_from_dict({"data": {"mixup": {"cutmix_alfa": 1.0}}})


def test_hxe_soft_gradient_by_hand_passes_gradcheck_and_survives_underflow() -> None:
    tax = random_tree(30, 6)
    loss = HXELoss(tax, alpha=0.3)
    rng = np.random.default_rng(2)
    eye = torch.eye(tax.num_leaves, dtype=torch.float64)
    a, b = rng.integers(0, tax.num_leaves, 4), rng.integers(0, tax.num_leaves, 4)
    q = 0.8 * (0.7 * eye[a] + 0.3 * eye[b]) + 0.2 / tax.num_leaves  # mixup + smoothing: every node weighted
    z = torch.randn(4, tax.num_leaves, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: loss(x, q), (z,))
    # Logits 1e4 apart: subtree masses underflow, the exact log-sum-exp path takes over; still the expectation.
    wide = torch.as_tensor(rng.normal(0, 1e4, (4, tax.num_leaves)))
    mixed = 0.7 * eye[a] + 0.3 * eye[b]
    hard = [loss(wide, torch.as_tensor(tax.leaves[c])) for c in (a, b)]
    torch.testing.assert_close(loss(wide, mixed), 0.7 * hard[0] + 0.3 * hard[1], rtol=1e-9, atol=1e-9)


def test_recipe_label_smoothing_equals_the_flat_heads_own() -> None:
    # timm's smoothing of the one-hot leaf rows (data.mixup.label_smoothing) against the flat head's option.
    tax = random_tree(20, 9)
    hard, _ = _hard_and_onehot(tax, 6, torch.float32, seed=3)
    out = torch.randn(6, tax.num_leaves)
    _, soft = SoftTargets(MixupConfig(label_smoothing=0.1), tax)(torch.zeros(6, 1), hard)
    plain = create_head("flat", tax, D)
    smoothed = create_head("flat", tax, D, label_smoothing=0.1)
    torch.testing.assert_close(plain.loss(out, soft), smoothed.loss(out, hard), rtol=1e-6, atol=1e-6)
