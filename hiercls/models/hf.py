"""Hugging Face integration: ``HierclsConfig``/``HierclsModel`` for ``AutoConfig``, ``AutoModel`` and ``Trainer``,
and the ``hierarchical-classification`` pipeline.

Importing this module registers ``model_type="hiercls"`` with ``AutoConfig`` and ``AutoModel`` and the pipeline
task with ``transformers.pipeline``; ``transformers`` is imported only here, so ``import hiercls`` stays light
(it imports this module once ``transformers`` loads its Auto classes: :mod:`hiercls._autoregister`).
There is one persistence format, hiercls's own (:meth:`HierarchicalClassifier.save_pretrained`): its
``config.json`` carries ``"model_type": "hiercls"``, and these classes read and write exactly those files. Loading
is from a local folder only and never runs code from it (no ``trust_remote_code``).

:class:`HierclsModel` registers the hiercls model's ``backbone`` and ``head`` under the same names, so its
``state_dict`` keys are those of ``model.safetensors`` (``Trainer``'s best-model reload and resumption read them
as they are). ``forward(input_ids=..., attention_mask=..., labels=...)`` (text) or ``forward(pixel_values=...,
labels=...)`` (images) returns :class:`HierarchicalClassifierOutput` with ``loss`` (the head's loss, when
``labels`` are node ids ``[B]``), ``logits`` (the head's output when it is one tensor) and ``node_probs``.

Example:
    >>> import tempfile, torch
    >>> from transformers import AutoModel
    >>> from hiercls.models import create_model
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    >>> d = create_model("timm:resnet10t", tax, head="flat").save_pretrained(tempfile.mkdtemp())
    >>> model = AutoModel.from_pretrained(d)
    >>> type(model).__name__, model.config.model_type
    ('HierclsModel', 'hiercls')
    >>> out = model(pixel_values=torch.randn(2, 3, 32, 32), labels=torch.tensor([2, 4]))
    >>> out.node_probs.shape, out.loss.dim()
    (torch.Size([2, 5]), 0)
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.pipelines import PIPELINE_REGISTRY, Pipeline
from transformers.utils import ModelOutput

from hiercls.models.card import DEFAULT_DECODER
from hiercls.models.classifier import CONFIG_FORMAT, MODEL_TYPE, HierarchicalClassifier
from hiercls.models.inference import predict, resolve_model_dir
from hiercls.taxonomy import Taxonomy

__all__ = [
    "PIPELINE_TASK",
    "HierarchicalClassificationPipeline",
    "HierarchicalClassifierOutput",
    "HierclsConfig",
    "HierclsModel",
    "pipeline",
]

PIPELINE_TASK = "hierarchical-classification"

# from_pretrained options that transformers' Auto classes and pipeline() pass along and that mean nothing for a
# local folder read offline; anything else unknown is refused by name.
_HUB_OPTIONS = frozenset(
    {
        "cache_dir",
        "force_download",
        "local_files_only",
        "proxies",
        "revision",
        "token",
        "use_auth_token",
        "trust_remote_code",
        "code_revision",
        "_commit_hash",
        "_from_auto",
        "_from_pipeline",
        "adapter_kwargs",
        "use_safetensors",
        "low_cpu_mem_usage",
        "weights_only",
        "key_mapping",
    }
)


class HierclsConfig(PretrainedConfig):
    """The ``config.json`` of a saved hiercls model as a transformers config (``model_type="hiercls"``).

    Every key hiercls writes (``backbone``, ``head``, ``head_options``, ``modality``, ``taxonomy_name``,
    ``taxonomy_fingerprint``, ``num_nodes``, ``taxonomy_file``...) is an attribute; the taxonomy itself stays in
    ``taxonomy.json.gz`` beside it, checked against the fingerprint when the model loads.
    """

    model_type = MODEL_TYPE

    def __init__(self, **kwargs: Any) -> None:
        kind = kwargs.pop("model_type", MODEL_TYPE)
        if kind != MODEL_TYPE:
            raise ValueError(f"HierclsConfig: model_type is {kind!r}; expected {MODEL_TYPE!r}")
        fmt = kwargs.get("format", CONFIG_FORMAT)
        if fmt != CONFIG_FORMAT:
            raise ValueError(f"HierclsConfig: format {fmt!r} is not a hiercls model config ({CONFIG_FORMAT!r})")
        super().__init__(**kwargs)

    @classmethod
    def from_model(cls, model: HierarchicalClassifier) -> HierclsConfig:
        """The config of an in-memory hiercls model (what its ``save_pretrained`` would write)."""
        return cls(**model.config())


@dataclass
class HierarchicalClassifierOutput(ModelOutput):
    """``loss`` (with labels), ``logits`` (the head's output when it is a tensor) and ``node_probs`` ``[B, N]``."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    node_probs: torch.Tensor | None = None


class HierclsModel(PreTrainedModel):
    """A :class:`~hiercls.models.HierarchicalClassifier` as a transformers ``PreTrainedModel``.

    Build it with :meth:`from_pretrained` (a folder written by hiercls) or :meth:`from_hiercls` (a model in
    memory). ``hiercls_model`` is the wrapped classifier (the same modules, not a copy).
    """

    config_class = HierclsConfig
    base_model_prefix = "hiercls"
    main_input_name = "input_ids"
    # The hiercls loss is a per-sample mean; Trainer must scale it for gradient accumulation itself.
    accepts_loss_kwargs = False
    supports_gradient_checkpointing = False

    def __init__(self, config: HierclsConfig, model: HierarchicalClassifier | None = None) -> None:
        if model is None:
            raise ValueError(
                "HierclsModel needs the hiercls model it wraps: use HierclsModel.from_pretrained(folder) for a "
                "saved one or HierclsModel.from_hiercls(model) for one in memory (a config alone holds no weights "
                "and no taxonomy)"
            )
        if not isinstance(model, HierarchicalClassifier):
            raise TypeError(f"model must be a hiercls HierarchicalClassifier; got {type(model).__name__}")
        if config.taxonomy_fingerprint != model.taxonomy.fingerprint:
            raise ValueError(
                f"config is for taxonomy fingerprint {str(config.taxonomy_fingerprint)[:16]} but the model's is "
                f"{model.taxonomy.fingerprint[:16]}"
            )
        super().__init__(config)
        # Registered under hiercls's own names so that the state_dict keys are those of model.safetensors;
        # the classifier itself is kept outside the module tree (its modules would otherwise appear twice).
        self.backbone = model.backbone
        self.head = model.head
        object.__setattr__(self, "hiercls_model", model)
        self.main_input_name = "input_ids" if model.modality == "text" else "pixel_values"
        self.post_init()

    def init_weights(self) -> None:
        """Nothing to initialise: the wrapped model arrives built (and, from a folder, loaded)."""

    def _init_weights(self, module: torch.nn.Module) -> None:
        return None

    @property
    def taxonomy(self) -> Taxonomy:
        return self.hiercls_model.taxonomy

    def train(self, mode: bool = True) -> HierclsModel:
        super().train(mode)
        self.hiercls_model.training = mode
        return self

    @classmethod
    def from_hiercls(cls, model: HierarchicalClassifier) -> HierclsModel:
        """Wrap an in-memory hiercls model (its modules are shared, not copied)."""
        return cls(HierclsConfig.from_model(model), model)

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike[str],
        *model_args: Any,
        config: Any = None,
        taxonomy: Taxonomy | None = None,
        trust_edits: bool = False,
        subfolder: str = "",
        device_map: Any = None,
        dtype: Any = None,
        torch_dtype: Any = None,
        **kwargs: Any,
    ) -> HierclsModel:
        """Load a folder written by hiercls (a model folder, or a run folder: its ``checkpoints/best``).

        Args:
            pretrained_model_name_or_path: a local folder; nothing is downloaded.
            config: ignored beyond a consistency check (the folder's ``config.json`` is read).
            taxonomy: the expected taxonomy (refused unless its fingerprint matches the saved one).
            trust_edits: load a folder whose files were edited since it was saved, with a warning naming them
                (see :meth:`HierarchicalClassifier.from_pretrained`).
            subfolder: a folder inside ``pretrained_model_name_or_path``.
            device_map: one device (``"cpu"``, ``"cuda:0"``, a ``torch.device``); dict maps are refused.
            dtype, torch_dtype: a floating dtype to cast the weights to (``"auto"``/``None``: as saved).

        Raises:
            FileNotFoundError: not a local folder with a saved hiercls model.
            TypeError: positional model arguments or an unknown option (named).
        """
        if model_args:
            raise TypeError("HierclsModel.from_pretrained takes no positional model arguments")
        unknown = sorted(set(kwargs) - _HUB_OPTIONS)
        if unknown:
            raise TypeError(f"HierclsModel.from_pretrained: unsupported option(s) {unknown}")
        path = Path(pretrained_model_name_or_path) / subfolder
        if not path.is_dir():
            raise FileNotFoundError(
                f"{str(path)!r} is not a local folder: hiercls models load offline from a folder written by "
                "hiercls (save_pretrained or a training run); nothing is downloaded"
            )
        if isinstance(device_map, dict):
            raise ValueError("device_map: hiercls models load onto one device; pass a device, not a map")
        device = torch.device("cpu" if device_map in (None, "auto") else device_map)
        d, _ = resolve_model_dir(path)
        clf = HierarchicalClassifier.from_pretrained(d, taxonomy, map_location=device, trust_edits=trust_edits)
        cast = dtype if dtype is not None else torch_dtype
        if cast not in (None, "auto"):
            clf = clf.to(getattr(torch, cast) if isinstance(cast, str) else cast)
        model = cls.from_hiercls(clf)
        if config is not None and getattr(config, "taxonomy_fingerprint", None) not in (
            None,
            clf.taxonomy.fingerprint,
        ):
            raise ValueError(f"config= is for another taxonomy than the model saved in {str(d)!r}")
        model.config.name_or_path = str(d)
        return model.eval()

    def save_pretrained(
        self,
        save_directory: str | os.PathLike[str],
        *,
        is_main_process: bool = True,
        state_dict: dict[str, torch.Tensor] | None = None,
        metrics: dict[str, Any] | None = None,
        safe_serialization: bool = True,
        push_to_hub: bool = False,
        **kwargs: Any,
    ) -> None:
        """hiercls's :meth:`~HierarchicalClassifier.save_pretrained` (the same files, model card included).

        ``state_dict`` (what ``Trainer`` passes) must hold this model's own weights: saving other tensors is
        refused rather than written under this model's config.
        """
        if push_to_hub:
            raise ValueError("push_to_hub: hiercls saves to a local folder only")
        if not safe_serialization:
            raise ValueError("safe_serialization=False: hiercls writes safetensors only (no pickle files)")
        unknown = sorted(set(kwargs) - {"max_shard_size", "variant", "token", "save_peft_format"})
        if unknown:
            raise TypeError(f"HierclsModel.save_pretrained: unsupported option(s) {unknown}")
        if not is_main_process:
            return
        if state_dict is not None:
            own = self.state_dict()
            if set(state_dict) != set(own):
                diff = sorted(set(state_dict) ^ set(own))[:3]
                raise ValueError(f"save_pretrained: state_dict keys differ from the model's (e.g. {diff})")
            for k, v in state_dict.items():
                w = own[k]
                same = v.data_ptr() == w.data_ptr() or (v.shape == w.shape and torch.equal(v.to(w.device), w))
                if not same:
                    raise ValueError(
                        f"save_pretrained: state_dict[{k!r}] is not the model's own weight; load it into the "
                        "model first (hiercls saves the model's weights)"
                    )
        self.hiercls_model.save_pretrained(save_directory, metrics=metrics)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        return_dict: bool | None = None,
    ) -> HierarchicalClassifierOutput | tuple[torch.Tensor, ...]:
        """The hiercls model on a tokenizer batch (text) or ``pixel_values`` (images).

        Args:
            input_ids, attention_mask, token_type_ids: the tokenizer's output (text models).
            pixel_values: images ``[B, 3, H, W]`` (image models) or volumes (``conv3d``).
            labels: node ids ``[B]`` (``-1`` = ignored), or whatever the head's loss takes.
            return_dict: ``False`` for a tuple (``None`` entries left out).
        """
        clf = self.hiercls_model
        if clf.modality == "text":
            inputs: Any = {
                k: v
                for k, v in (
                    ("input_ids", input_ids),
                    ("attention_mask", attention_mask),
                    ("token_type_ids", token_type_ids),
                )
                if v is not None
            }
            if "input_ids" not in inputs:
                raise ValueError("a text model needs input_ids (a tokenizer batch)")
        else:
            if pixel_values is None:
                raise ValueError(f"an {clf.modality} model needs pixel_values")
            inputs = pixel_values
        output = clf(inputs)
        out = HierarchicalClassifierOutput(
            loss=None if labels is None else clf.loss(output, labels),
            logits=output if isinstance(output, torch.Tensor) else None,
            node_probs=clf.node_probs(output),
        )
        use_dict = return_dict if return_dict is not None else self.config.return_dict
        return out if use_dict else out.to_tuple()


class HierarchicalClassificationPipeline(Pipeline):
    """``transformers.pipeline("hierarchical-classification", model=folder)``: texts or images -> decoded nodes.

    Each input gives what ``hiercls predict`` prints (:func:`hiercls.models.inference.predict`, the same code):
    ``{"prediction": {"id", "name", "display_name", "prob"}`` (node-set decoders: ``{"ids", "names",
    "display_names"}``), ``"path"`` (display names from the root to the prediction) and ``"top_k"`` (the most
    probable leaves)``}``. Call options: ``decoder`` (any :func:`hiercls.decode.parse_decoder` spec, default
    ``argmax_leaf``), ``top_k`` (default 5), ``image_size``.
    """

    _load_tokenizer = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_processor = False

    def __init__(self, model: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(model, HierarchicalClassifier):
            model = HierclsModel.from_hiercls(model)
        if not isinstance(model, HierclsModel):
            raise TypeError(f"the {PIPELINE_TASK} pipeline needs a HierclsModel; got {type(model).__name__}")
        kwargs.setdefault("device", "cpu")
        super().__init__(model, *args, **kwargs)

    def _sanitize_parameters(
        self, decoder: str | None = None, top_k: int | None = None, image_size: int | None = None, **kwargs: Any
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        if kwargs:
            raise TypeError(f"{PIPELINE_TASK} pipeline: unknown option(s) {sorted(kwargs)}")
        forward: dict[str, Any] = {}
        if decoder is not None:
            forward["decoder"] = decoder
        if top_k is not None:
            forward["top_k"] = int(top_k)
        if image_size is not None:
            forward["image_size"] = int(image_size)
        return {}, forward, {}

    def preprocess(self, inputs: Any) -> dict[str, Any]:
        # Image files are opened by predict, as for ``hiercls predict``; a _Batch is a group of inputs.
        items = list(inputs) if isinstance(inputs, _Batch) else [inputs]
        if self.model.hiercls_model.modality == "text" and not all(isinstance(x, str) for x in items):
            bad = next(x for x in items if not isinstance(x, str))
            raise TypeError(f"this is a text model: give strings, not {type(bad).__name__}")
        return {"inputs": items, "batched": isinstance(inputs, _Batch)}

    def _forward(
        self,
        model_inputs: dict[str, Any],
        decoder: str = DEFAULT_DECODER,
        top_k: int = 5,
        image_size: int | None = None,
    ) -> dict[str, Any]:
        clf = self.model.hiercls_model
        items = model_inputs["inputs"]
        results = predict(
            clf,
            clf.taxonomy,
            items,
            decoder=decoder,
            top_k=top_k,
            batch_size=len(items),
            device=self.device,
            image_size=image_size,
        )
        return {"results": results, "batched": model_inputs["batched"]}

    def postprocess(self, model_outputs: dict[str, Any]) -> Any:
        return model_outputs["results"] if model_outputs["batched"] else model_outputs["results"][0]

    def get_iterator(
        self,
        inputs: Any,
        num_workers: int,
        batch_size: int,
        preprocess_params: dict[str, Any],
        forward_params: dict[str, Any],
        postprocess_params: dict[str, Any],
    ) -> Iterator[dict[str, Any]]:
        """``pipe(inputs, batch_size=n)``: groups of ``n`` raw inputs, each decoded by one :func:`predict` call.

        transformers' batching pads tokenizer or image-processor tensors; here the model tokenises and transforms
        inside ``predict``, so the grouping happens before (one group per step of transformers' loop) and the
        results are unrolled after, in input order.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int; got {batch_size!r}")
        groups = _Groups(inputs, batch_size) if isinstance(inputs, Sized) else _group(inputs, batch_size)
        results = super().get_iterator(groups, num_workers, 1, preprocess_params, forward_params, postprocess_params)
        return itertools.chain.from_iterable(results)


class _Batch(tuple):
    """A group of raw pipeline inputs (one :func:`predict` call)."""

    __slots__ = ()


class _Groups(Sequence):
    """``inputs`` (a list or a map-style dataset) in consecutive groups of ``size``, read lazily."""

    def __init__(self, inputs: Any, size: int) -> None:
        self.inputs, self.size = inputs, size

    def __len__(self) -> int:
        return -(-len(self.inputs) // self.size)

    def __getitem__(self, i: int) -> _Batch:  # type: ignore[override]
        if not 0 <= i < len(self):
            raise IndexError(i)
        stop = min(len(self.inputs), (i + 1) * self.size)
        return _Batch(self.inputs[j] for j in range(i * self.size, stop))


def _group(inputs: Iterable[Any], size: int) -> Iterator[_Batch]:
    it = iter(inputs)
    while chunk := _Batch(itertools.islice(it, size)):
        yield chunk


def pipeline(
    model: str | os.PathLike[str] | HierarchicalClassifier | HierclsModel,
    *,
    device: str | torch.device = "cpu",
    trust_edits: bool = False,
    **kwargs: Any,
) -> HierarchicalClassificationPipeline:
    """The ``hierarchical-classification`` pipeline for a saved folder or a model in memory.

    ``trust_edits``: load a folder whose files were edited since it was saved (with a warning naming them).

    Example:
        >>> import tempfile
        >>> from hiercls.models import create_model
        >>> from hiercls.taxonomy import Taxonomy
        >>> from PIL import Image
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> d = create_model("timm:resnet10t", tax, head="flat").save_pretrained(tempfile.mkdtemp())
        >>> out = pipeline(d)(Image.new("RGB", (32, 32)), top_k=2)
        >>> sorted(out), out["prediction"]["name"] in tax.names, len(out["top_k"])
        (['path', 'prediction', 'top_k'], True, 2)
    """
    if isinstance(model, (str, os.PathLike)):
        model = HierclsModel.from_pretrained(model, trust_edits=trust_edits)
    return HierarchicalClassificationPipeline(model, device=device, task=PIPELINE_TASK, **kwargs)


def _register() -> None:
    AutoConfig.register(MODEL_TYPE, HierclsConfig, exist_ok=True)
    AutoModel.register(HierclsConfig, HierclsModel, exist_ok=True)
    if PIPELINE_TASK not in PIPELINE_REGISTRY.get_supported_tasks():
        PIPELINE_REGISTRY.register_pipeline(
            PIPELINE_TASK, pipeline_class=HierarchicalClassificationPipeline, pt_model=HierclsModel, type="multimodal"
        )


_register()
