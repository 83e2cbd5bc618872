"""Models: one model class over timm / Hugging Face / 3-D conv backbones, offline weights, save/load.

:func:`create_model` is the one factory (a backbone spec from :data:`BACKBONES` + a head name), its
:class:`HierarchicalClassifier` the one model class, and :class:`HierarchicalModel` the contract that the
training loop, evaluation and the CLI rely on.

Example:
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    >>> model = create_model("timm:resnet10t", tax, head="flat")
    >>> model.head_name, model.modality, isinstance(model, HierarchicalModel)
    ('flat', 'image', True)
"""

from typing import Any

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
    "ModuleBackbone",
    "PackageWeights",
    "TimmBackbone",
    "TinySegNet3D",
    "backbone_from_module",
    "create_backbone",
    "create_model",
    "load_by_name",
    "load_by_order",
    "move_to_device",
    "parse_backbone",
    "read_state_dict",
    "rebuild_backbone",
]

_HF_NAMES = ("HierarchicalClassificationPipeline", "HierarchicalClassifierOutput", "HierclsConfig", "HierclsModel")


def __getattr__(name: str) -> Any:
    # The Hugging Face classes load transformers' modelling code (seconds): only when asked for.
    if name in _HF_NAMES:
        from hiercls.models import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'hiercls.models' has no attribute {name!r}")
