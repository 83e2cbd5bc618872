"""Models: timm / Hugging Face backbones with hierarchical heads, offline weights, save/load.

Example:
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    >>> model = create_model("timm:resnet10t", tax, head="flat")
    >>> model.head_name, model.modality
    ('flat', 'image')
"""

from hiercls.models.backbones import HFBackbone, TimmBackbone, parse_backbone
from hiercls.models.classifier import PROMPT_HEADS, HierarchicalClassifier, create_model, move_to_device
from hiercls.models.weights import PACKAGE_WEIGHTS, PackageWeights, load_by_name, load_by_order, read_state_dict

__all__ = [
    "PACKAGE_WEIGHTS",
    "PROMPT_HEADS",
    "HFBackbone",
    "HierarchicalClassifier",
    "PackageWeights",
    "TimmBackbone",
    "create_model",
    "load_by_name",
    "load_by_order",
    "move_to_device",
    "parse_backbone",
    "read_state_dict",
]
