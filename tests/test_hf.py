"""Hugging Face integration: AutoConfig/AutoModel load hiercls's own folders (and a training run's), the wrapper's
outputs and weights are the hiercls model's, Trainer-style save round-trips, the pipeline is hiercls predict,
the model card states taxonomy, head, decoder and metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoTokenizer
from transformers import pipeline as hf_pipeline

from hiercls.models import HierarchicalClassifier, create_model
from hiercls.models.hf import HierclsConfig, HierclsModel, pipeline
from hiercls.models.inference import predict
from hiercls.taxonomy import Taxonomy

TEXTS = ["the cat purrs", "a dog barks", "the car drives fast", "a boat sails on the sea"]


@pytest.fixture(scope="module")
def tax() -> Taxonomy:
    return Taxonomy(
        [("root", "animal"), ("animal", "cat"), ("animal", "dog"), ("root", "vehicle"), ("vehicle", "car")],
        name="toy",
    )


@pytest.fixture(scope="module")
def text_dir(tiny_bert: Path, tax: Taxonomy, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = create_model(f"hf:{tiny_bert}", tax, head="conditional_softmax", max_length=16)
    return model.save_pretrained(tmp_path_factory.mktemp("text_model"))


def test_auto_classes_load_a_hiercls_folder_offline_and_match_it(text_dir: Path, tax: Taxonomy) -> None:
    cfg = AutoConfig.from_pretrained(text_dir)
    assert isinstance(cfg, HierclsConfig) and cfg.head == "conditional_softmax"
    assert cfg.taxonomy_fingerprint == tax.fingerprint
    model = AutoModel.from_pretrained(text_dir, local_files_only=True)
    assert isinstance(model, HierclsModel) and not model.training
    ref = HierarchicalClassifier.from_pretrained(text_dir).eval()
    # the wrapper's weights are the file's, under the file's own names (Trainer reloads them as they are)
    saved = load_file(str(text_dir / "model.safetensors"))
    own = model.state_dict()
    assert set(own) == set(saved)
    assert all(torch.equal(own[k], saved[k]) for k in saved)
    batch = ref.backbone.tokenize(TEXTS)
    out = model(**batch, labels=torch.tensor([2, 3, 5, -1]))
    with torch.no_grad():
        raw = ref(batch)
        want_loss = ref.loss(raw, torch.tensor([2, 3, 5, -1]))
    assert torch.allclose(out.node_probs, ref.node_probs(raw), atol=1e-6)
    assert torch.allclose(out.logits, raw, atol=1e-6)
    assert out.loss.item() == pytest.approx(want_loss.item(), rel=1e-5)
    as_tuple = model(**batch, return_dict=False)
    assert len(as_tuple) == 2 and torch.allclose(as_tuple[1], out.node_probs)


def test_save_pretrained_writes_hiercls_files_and_refuses_foreign_weights(text_dir: Path, tmp_path: Path) -> None:
    model = HierclsModel.from_pretrained(text_dir)
    with torch.no_grad():
        next(model.head.parameters()).add_(0.5)  # a changed weight must be what is saved
    model.save_pretrained(tmp_path, state_dict=model.state_dict(), metrics={"argmax_leaf/accuracy": 0.25})
    assert {"config.json", "model.safetensors", "taxonomy.json.gz", "README.md", "tokenizer.json", "backbone"} <= {
        p.name for p in tmp_path.iterdir()
    }
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "hiercls"
    back = HierarchicalClassifier.from_pretrained(tmp_path)
    for k, v in back.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    other = {k: v.clone() + 1 for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="is not the model's own weight"):
        model.save_pretrained(tmp_path / "x", state_dict=other)
    with pytest.raises(ValueError, match="safetensors only"):
        model.save_pretrained(tmp_path / "x", safe_serialization=False)


def test_loading_refuses_what_it_cannot_do_faithfully(text_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="offline"):
        HierclsModel.from_pretrained("someone/some-model-on-the-hub")
    with pytest.raises(TypeError, match="unsupported option"):
        HierclsModel.from_pretrained(text_dir, attn_implementation="sdpa", output_hidden_states=True)
    with pytest.raises(ValueError, match="needs the hiercls model it wraps"):
        HierclsModel(AutoConfig.from_pretrained(text_dir))
    other = Taxonomy([("root", "x")])
    with pytest.raises(Exception, match="trained on taxonomy"):
        HierclsModel.from_pretrained(text_dir, taxonomy=other)


def _rounded(x: object) -> object:
    if isinstance(x, float):
        return round(x, 5)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def test_pipeline_equals_hiercls_predict(text_dir: Path) -> None:
    ref = HierarchicalClassifier.from_pretrained(text_dir).eval()
    want = predict(ref, ref.taxonomy, TEXTS, decoder="optimal_hf1", top_k=2)
    pipe = hf_pipeline("hierarchical-classification", model=str(text_dir), device="cpu")
    got = pipe(TEXTS, decoder="optimal_hf1", top_k=2)
    assert _rounded(got) == _rounded(want)  # the pipeline runs one text at a time: float32 round-off only
    one = pipeline(ref)(TEXTS[0])
    assert one == predict(ref, ref.taxonomy, TEXTS[:1])[0]
    assert one["path"][0] == "root" and one["prediction"]["name"] in ref.taxonomy.names


def test_pipeline_batches_texts_and_images_in_input_order(text_dir: Path, tmp_path: Path) -> None:
    """``pipe(inputs, batch_size=n)`` as transformers users call it (it raised: no tokenizer to pad with)."""
    ref = HierarchicalClassifier.from_pretrained(text_dir).eval()
    texts = TEXTS + TEXTS[:1]  # 5 inputs: groups of 2, 2 and 1
    want = predict(ref, ref.taxonomy, texts, top_k=3)
    pipe = hf_pipeline("hierarchical-classification", model=str(text_dir), device="cpu")
    for batch_size in (1, 2, 4, 8):
        assert _rounded(pipe(texts, batch_size=batch_size, top_k=3)) == _rounded(want), batch_size
    streamed = pipe((t for t in texts), batch_size=2, top_k=3)  # a generator streams, as transformers does
    assert _rounded(list(streamed)) == _rounded(want)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        pipe(texts, batch_size=0)
    tax = ref.taxonomy
    images = [Image.new("RGB", (32, 32), color) for color in ("red", "blue", "green", "white", "black")]
    image_dir = create_model("timm:resnet10t", tax, head="flat").save_pretrained(tmp_path / "img")
    image_pipe = pipeline(image_dir)
    one_by_one = [image_pipe(im) for im in images]
    batched = image_pipe(images, batch_size=2)
    # the same decisions; probabilities to float32 round-off (a batch of 2 runs other conv kernels than 1)
    assert [p["prediction"]["name"] for p in batched] == [p["prediction"]["name"] for p in one_by_one]
    assert _rounded(batched) == _rounded(one_by_one)


# import hiercls loads nothing heavy (no numpy, torch, transformers, not even typing)
LIGHT = """import hiercls
heavy = sorted(m for m in ("numpy", "torch", "transformers", "typing", "hiercls.models") if m in sys.modules)
assert not heavy, heavy"""
PLAIN_IMPORT = """
import sys
{imports}
print(type(AutoModel.from_pretrained(sys.argv[1])).__name__)
print(AutoTokenizer.from_pretrained(sys.argv[1])(["the cat purrs"])["input_ids"])
"""


@pytest.mark.parametrize(
    "imports",
    [
        LIGHT + "\nfrom transformers import AutoModel, AutoTokenizer",
        LIGHT + "\nfrom transformers import Trainer\nfrom transformers import AutoModel, AutoTokenizer",
        "from transformers import AutoModel, AutoTokenizer\nimport hiercls",
    ],
    ids=["auto", "after-trainer", "transformers-first"],
)
def test_auto_model_works_after_a_plain_import_hiercls(text_dir: Path, imports: str) -> None:
    """No ``import hiercls.models.hf``: hiercls registers once transformers loads its Auto classes."""
    code = PLAIN_IMPORT.format(imports=imports)
    run = subprocess.run([sys.executable, "-c", code, str(text_dir)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    name, ids = run.stdout.strip().splitlines()[-2:]
    want = AutoTokenizer.from_pretrained(str(text_dir))(["the cat purrs"])["input_ids"]
    assert name == "HierclsModel" and ids == str(want)
    assert "model of type `hiercls`" not in run.stderr  # AutoTokenizer read the folder's config as hiercls's


def test_run_folder_loads_through_auto_model_and_its_card_has_the_metrics(tiny_bert: Path, tmp_path: Path) -> None:
    from hiercls.train import config_from_dict, train

    (tmp_path / "tax.txt").write_text("root animal\nroot vehicle\nanimal cat\nanimal dog\nvehicle car\n")
    cfg = config_from_dict(
        {
            "taxonomy": str(tmp_path / "tax.txt"),
            "model": {"backbone": f"hf:{tiny_bert}", "head": "flat", "backbone_options": {"max_length": 16}},
            "data": {
                "dataset": "synthetic",
                "batch_size": 4,
                "options": {"kind": "text", "train_samples": 4, "val_samples": 4},
            },
            "schedule": {"max_steps": 1},
            "eval": {"decoders": ["argmax_leaf"]},
            "run": {"out_dir": str(tmp_path / "run"), "progress": False, "plot": False, "seed": 0},
        }
    )
    result = train(cfg)
    best = tmp_path / "run" / "checkpoints" / "best"
    model = AutoModel.from_pretrained(best)
    assert isinstance(model, HierclsModel)
    via_run = HierclsModel.from_pretrained(tmp_path / "run")  # a run folder: its checkpoints/best
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in via_run.state_dict().items())
    card = (best / "README.md").read_text()
    assert "flat" in card and "6 nodes, 3 leaves" in card and "argmax_leaf" in card
    assert f"| argmax_leaf | {result['argmax_leaf/accuracy']:.4f} | {result['argmax_leaf/hF1_micro']:.4f} |" in card


def test_trainer_checkpoints_and_best_model_reload_use_the_hiercls_files(text_dir: Path, tmp_path: Path) -> None:
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    model = HierclsModel.from_pretrained(text_dir)
    tok = model.hiercls_model.backbone.tokenizer
    labels = [2, 3, 5, 5]
    data = [{**tok(t, truncation=True, max_length=16), "labels": y} for t, y in zip(TEXTS, labels, strict=True)]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=4,
        learning_rate=0.05,  # small full-batch steps on the evaluation data: the loss goes down
        optim="sgd",
        lr_scheduler_type="constant",
        use_cpu=True,
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
        save_strategy="steps",
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="loss",
        greater_is_better=True,  # "best" = the highest loss: the step-2 checkpoint, not the final weights
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=data, eval_dataset=data, data_collator=DataCollatorWithPadding(tok)
    )
    trainer.train()
    losses = {r["step"]: r["eval_loss"] for r in trainer.state.log_history if "eval_loss" in r}
    best = max(losses, key=losses.get)
    assert best == 2, losses  # otherwise the final weights would be the best ones without any reload
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best}")
    ckpt = Path(trainer.state.best_model_checkpoint)
    assert HierarchicalClassifier.from_pretrained(ckpt).head_name == "conditional_softmax"  # hiercls's own files
    saved = load_file(str(ckpt / "model.safetensors"))
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())  # the reload took every weight
    other = load_file(str(tmp_path / f"checkpoint-{6 - best}" / "model.safetensors"))
    assert not all(torch.equal(v, other[k]) for k, v in model.state_dict().items())
