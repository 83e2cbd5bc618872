"""Models: one model class over timm / Hugging Face / 3-D conv backbones, offline weights, save/load.

:func:`create_model` is the one factory (a backbone spec from :data:`BACKBONES` + a head name), its
:class:`HierarchicalClassifier` the one model class, and :class:`HierarchicalModel` the contract that the
training loop, evaluation and the CLI rely on. Hierarchical prompting (TransHP, :mod:`hiercls.models.prompt`)
wraps a ViT or a text encoder, so it is a model too. :func:`predict` runs a saved model on raw inputs
(:mod:`hiercls.models.inference`). The ``transformers`` classes (``AutoModel``, the pipeline) are in
:mod:`hiercls.models.hf`: importing it registers them (it loads ``transformers``' modelling and pipeline code, so
``import hiercls.models`` leaves it out; ``import hiercls`` imports it once ``transformers`` loads its Auto classes).

Example:
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    >>> model = create_model("timm:resnet10t", tax, head="flat")
    >>> model.head_name, model.modality, isinstance(model, HierarchicalModel)
    ('flat', 'image', True)
"""

from hiercls.models.backbones import (
    BACKBONES,
    HFBackbone,
    ModuleBackbone,
    TimmBackbone,
    backbone_from_module,
    create_backbone,
    parse_backbone,
    rebuild_backbone,
)
from hiercls.models.classifier import PROMPT_HEADS, HierarchicalClassifier, create_model, move_to_device
from hiercls.models.contract import Backbone, HierarchicalModel
from hiercls.models.conv3d import TinySegNet3D
from hiercls.models.files import CheckpointError
from hiercls.models.inference import predict, read_inputs, resolve_model_dir, write_predictions
from hiercls.models.prompt import PromptedTextEncoder, TransHPViT, create_prompt_model
from hiercls.models.prompt_pool import HierarchicalPromptPool, default_prompt_positions
from hiercls.models.weights import PACKAGE_WEIGHTS, PackageWeights, load_by_name, load_by_order, read_state_dict

__all__ = [
    "BACKBONES",
    "PACKAGE_WEIGHTS",
    "PROMPT_HEADS",
    "Backbone",
    "CheckpointError",
    "HFBackbone",
    "HierarchicalClassifier",
    "HierarchicalModel",
    "HierarchicalPromptPool",
    "ModuleBackbone",
    "PackageWeights",
    "PromptedTextEncoder",
    "TimmBackbone",
    "TinySegNet3D",
    "TransHPViT",
    "backbone_from_module",
    "create_backbone",
    "create_model",
    "create_prompt_model",
    "default_prompt_positions",
    "load_by_name",
    "load_by_order",
    "move_to_device",
    "parse_backbone",
    "predict",
    "read_inputs",
    "read_state_dict",
    "rebuild_backbone",
    "resolve_model_dir",
    "write_predictions",
]
