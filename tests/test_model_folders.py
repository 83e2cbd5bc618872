"""A saved model folder reloads exactly or is refused (issue 29 finding 3), is verified as a whole (issue 28
item 5), and a text model's tokenizer files sit at the top of the folder (issue 29 finding 4).

Each backbone kind is saved and reloaded and its outputs compared bit for bit: timm by name, a timm object built
with non-default constructor arguments, a Hugging Face text encoder by folder and as an object, conv3d. The
transformers ``AutoModel`` and :func:`hiercls.models.predict` read the same folders.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import timm
import torch
from _tiny import TINY_BERT_WORDS, build_tiny_bert
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoTokenizer

from hiercls.cli import main
from hiercls.models import CheckpointError, HierarchicalClassifier, create_model, predict
from hiercls.models.hf import HierclsModel
from hiercls.taxonomy import Taxonomy

TEXTS = ["the cat purrs", "a dog barks on the road", "the car drives fast"]


@pytest.fixture(scope="module")
def tax() -> Taxonomy:
    shown = {"a": "Animal", "x": "Cat", "y": "Dog", "b": "Boat"}
    return Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")], display_names=shown, name="toy")


def _outputs(model: HierarchicalClassifier, x: object) -> torch.Tensor:
    with torch.no_grad():
        return model.node_probs(model(x))


def _reloads_exactly(model: HierarchicalClassifier, x: object, folder: Path) -> HierarchicalClassifier:
    model.eval()
    d = model.save_pretrained(folder)
    back = HierarchicalClassifier.from_pretrained(d).eval()
    assert torch.equal(_outputs(back, x), _outputs(model, x))
    auto = AutoModel.from_pretrained(d)  # transformers reads the same folder the same way
    batch = {"pixel_values": x} if isinstance(x, torch.Tensor) else dict(model.backbone.tokenize(x))
    with torch.no_grad():
        assert torch.equal(auto(**batch).node_probs, _outputs(model, x))
    return back


def test_timm_by_name_and_conv3d_reload_exactly(tax: Taxonomy, tmp_path: Path) -> None:
    torch.manual_seed(0)
    _reloads_exactly(create_model("timm:resnet10t", tax, head="flat"), torch.randn(2, 3, 32, 32), tmp_path / "t")
    vol = create_model("conv3d:4", tax, head="nested_sigmoid", in_channels=2).eval()
    d = vol.save_pretrained(tmp_path / "v")
    x = torch.randn(1, 2, 4, 4, 4)
    assert torch.equal(_outputs(HierarchicalClassifier.from_pretrained(d).eval(), x), _outputs(vol, x))


@pytest.mark.parametrize(
    ("kwargs", "chans"),
    [({"global_pool": "max"}, 3), ({"global_pool": "max", "in_chans": 1}, 1), ({"drop_path_rate": 0.1}, 3)],
)
def test_timm_object_with_non_default_arguments_reloads_exactly(
    tax: Taxonomy, tmp_path: Path, kwargs: dict, chans: int
) -> None:
    torch.manual_seed(1)
    model = create_model(timm.create_model("resnet10t", **kwargs), tax, head="flat")
    if not hasattr(timm.models, "get_model_args"):
        # A timm that records no constructor arguments: refused, unless hiercls still knows every one that matters
        # (the drop rates timm keeps in _model_args); then the reload below must be exact.
        try:
            model.save_pretrained(tmp_path / "probe")
        except ValueError as err:
            assert "would rebuild backbone 'timm:resnet10t'" in str(err)
            return
    x = torch.randn(2, chans, 32, 32)
    back = _reloads_exactly(model, x, tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())["backbone_kwargs"]
    if hasattr(timm.models, "get_model_args"):  # an older timm may drop an argument when hiercls resets the head
        assert {k: saved[k] for k in kwargs} == kwargs
    # the reloaded network is the one timm builds from those arguments (not only the same numbers on x)
    assert repr(back.network) == repr(model.network)
    # hiercls predict (the pipeline's code) reads the folder the same way
    if chans == 3:
        images = [Image.fromarray((x[0].clamp(0, 1) * 255).byte().permute(1, 2, 0).numpy())]
        assert predict(back, tax, images) == predict(model, tax, images)


def test_timm_object_that_cannot_be_rebuilt_is_refused_at_save(tax: Taxonomy, tmp_path: Path) -> None:
    model = create_model(timm.create_model("resnet10t", act_layer=torch.nn.SiLU), tax, head="flat")
    # timm without get_model_args records no arguments: the rebuilt network differs, and that is refused instead
    why = (
        r"act_layer=.*cannot be written.*create_model\('timm:"
        if hasattr(timm.models, "get_model_args")
        else "would rebuild"
    )
    with pytest.raises(ValueError, match=why):
        model.save_pretrained(tmp_path / "a")
    assert not (tmp_path / "a" / "config.json").exists()
    # a network changed after it was built: the saved arguments would rebuild another one
    changed = create_model("timm:resnet10t", tax, head="flat")
    changed.save_pretrained(tmp_path / "first")  # saved once (its check passed), then changed in place
    changed.network.reset_classifier(0, global_pool="max")
    with pytest.raises(ValueError, match=r"would rebuild backbone 'timm:resnet10t'.*pool_type=max"):
        changed.save_pretrained(tmp_path / "b")
    assert not (tmp_path / "b" / "config.json").exists()


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_bert: Path) -> object:
    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    # the fixture's vocabulary covers the test sentences: different texts give different ids
    ids = tok(TEXTS)["input_ids"]
    assert not any(tok.unk_token_id in i for i in ids) and len({tuple(i) for i in ids}) == len(TEXTS)
    assert set(" ".join(TEXTS).split()) <= set(TINY_BERT_WORDS)
    return tok


def test_text_models_reload_exactly_with_the_tokenizer_at_the_top(
    tax: Taxonomy, tiny_bert: Path, tiny_tokenizer: object, tmp_path: Path
) -> None:
    torch.manual_seed(2)
    by_name = create_model(f"hf:{tiny_bert}", tax, head="conditional_softmax", max_length=12)
    _reloads_exactly(by_name, TEXTS, tmp_path / "n")
    # an object with eager attention: the kernel is saved too (sdpa differs in the last bits)
    encoder = build_tiny_bert(3, attn="eager", vocab_size=tiny_tokenizer.vocab_size, max_positions=64)
    obj = create_model(encoder, tax, head="flat", tokenizer=tiny_tokenizer, pooling="cls")
    back = _reloads_exactly(obj, TEXTS, tmp_path / "o")
    assert back.backbone.attn_implementation == "eager" and back.backbone.pooling == "cls"
    for d in (tmp_path / "n", tmp_path / "o"):
        assert not (d / "tokenizer").exists() and (d / "tokenizer.json").is_file()
        tok = AutoTokenizer.from_pretrained(str(d))
        assert tok(TEXTS)["input_ids"] == tiny_tokenizer(TEXTS)["input_ids"]


def test_folder_with_tokenizer_subfolder_of_config_version_1_still_loads(
    tax: Taxonomy, tiny_bert: Path, tmp_path: Path
) -> None:
    model = create_model(f"hf:{tiny_bert}", tax, head="flat").eval()
    d = model.save_pretrained(tmp_path / "m")
    # rewrite it as version 1 wrote it: tokenizer/, no files_sha256, the identity header without them
    cfg = json.loads((d / "config.json").read_text())
    (d / "tokenizer").mkdir()
    for rel in cfg.pop("files_sha256"):
        if rel.startswith("tokenizer"):
            shutil.move(d / rel, d / "tokenizer" / rel)
    del cfg["tokenizer_folder"]
    cfg["version"] = 1
    provenance = {"format", "version", "hiercls_version", "taxonomy_name", "weights_source", "weights_sha256"}
    identity = json.dumps({k: v for k, v in cfg.items() if k not in provenance}, sort_keys=True, ensure_ascii=False)
    save_file(
        load_file(d / "model.safetensors"),
        d / "model.safetensors",
        metadata={"format": "pt", "hiercls": "hiercls.model", "hiercls_identity": identity},
    )
    cfg["weights_sha256"] = __import__("hashlib").sha256((d / "model.safetensors").read_bytes()).hexdigest()
    (d / "config.json").write_text(json.dumps(cfg))
    back = HierarchicalClassifier.from_pretrained(d).eval()
    assert torch.equal(_outputs(back, TEXTS), _outputs(model, TEXTS))


# ---------------------------------------------------------------- the folder verified as a whole


def _set_json(path: Path, **changes: object) -> None:
    obj = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            obj.pop(k)
        else:
            obj[k] = v
    path.write_text(json.dumps(obj))


def _edit_tokenizer(d: Path) -> None:
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["dog"], vocab["cat"] = vocab["cat"], vocab["dog"]
    (d / "tokenizer.json").write_text(json.dumps(tok))


def _rotate_display_names(d: Path) -> None:
    with gzip.open(d / "taxonomy.json.gz", "rt", encoding="utf-8") as f:
        doc = json.load(f)
    shown = doc["display_names"]
    doc["display_names"] = shown[:1] + shown[2:] + shown[1:2]  # every printed prediction would change
    with gzip.open(d / "taxonomy.json.gz", "wt", encoding="utf-8") as f:
        json.dump(doc, f)


EDITS = [
    # (id, edit, the file the refusal names, what it says)
    (
        "hidden_act",
        lambda d: _set_json(d / "backbone" / "config.json", hidden_act="relu"),
        "backbone/config.json",
        "edited",
    ),
    ("tokenizer", _edit_tokenizer, "tokenizer.json", "edited"),
    ("tokenizer_gone", lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json", "missing from the saved model"),
    ("display_names", _rotate_display_names, "taxonomy.json.gz", "edited"),
    ("added_tokens", lambda d: (d / "added_tokens.json").write_text('{"dog": 9}'), "added_tokens.json", "added"),
    ("no_weights_sha256", lambda d: _set_json(d / "config.json", weights_sha256=None), "config.json", "weights_sha256"),
    ("no_files_sha256", lambda d: _set_json(d / "config.json", files_sha256=None), "config.json", "files_sha256"),
    ("temperature", lambda d: _set_json(d / "config.json", temperature=2.0), "config.json", "temperature"),
    (
        "digest_outside",
        lambda d: _set_json(d / "config.json", files_sha256={"../x": "0" * 64}),
        "config.json",
        "outside the folder",
    ),
]


@pytest.fixture(scope="module")
def text_folder(tax: Taxonomy, tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(4)
    model = create_model(f"hf:{tiny_bert}", tax, head="flat")
    return model.save_pretrained(tmp_path_factory.mktemp("text") / "m")


@pytest.mark.parametrize(("edit", "culprit", "says"), [e[1:] for e in EDITS], ids=[e[0] for e in EDITS])
def test_an_edited_model_folder_is_refused_naming_the_file(
    text_folder: Path, tmp_path: Path, edit: object, culprit: str, says: str
) -> None:
    d = tmp_path / "m"
    shutil.copytree(text_folder, d)
    HierarchicalClassifier.from_pretrained(d)  # the copy itself loads
    edit(d)
    error = FileNotFoundError if says.startswith("missing") else CheckpointError
    with pytest.raises(error) as info:
        HierarchicalClassifier.from_pretrained(d)
    msg = str(info.value)
    assert str(d / culprit) in msg and says in msg, msg
    assert error is FileNotFoundError or "trust_edits=True" in msg or "outside" in msg
    with pytest.raises(error, match=culprit.replace(".", r"\.")):
        AutoModel.from_pretrained(d)  # every loader verifies


def test_trust_edits_loads_an_edited_folder_and_says_what_changed(text_folder: Path, tmp_path: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(text_folder, d)
    before = HierarchicalClassifier.from_pretrained(d).eval()
    _set_json(d / "backbone" / "config.json", hidden_act="relu")
    with pytest.warns(UserWarning, match=r"trust_edits=True.*backbone/config\.json: edited"):
        after = HierarchicalClassifier.from_pretrained(d, trust_edits=True).eval()
    # the edit is real: relu instead of gelu changes the outputs
    assert not torch.allclose(_outputs(after, TEXTS), _outputs(before, TEXTS))
    with pytest.warns(UserWarning, match="edited"):
        HierclsModel.from_pretrained(d, trust_edits=True)


def test_cli_refuses_an_edited_folder_and_loads_it_with_trust_edits(text_folder: Path, tmp_path: Path, capsys) -> None:
    d = tmp_path / "m"
    shutil.copytree(text_folder, d)
    _set_json(d / "backbone" / "config.json", hidden_act="relu")
    assert main(["predict", "--model", str(d), TEXTS[0], "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "backbone/config.json" in err and "--trust-edits" in err, err
    with pytest.warns(UserWarning, match=r"backbone/config\.json: edited"):
        assert main(["predict", "--model", str(d), TEXTS[0], "--no-progress", "--trust-edits"]) == 0
    assert "arg:1" in capsys.readouterr().out
