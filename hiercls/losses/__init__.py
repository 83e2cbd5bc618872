"""Hierarchical losses, usable on their own with any model that produces logits in the documented layout."""

from hiercls.losses.chained_softmax import ChainedSoftmax
from hiercls.losses.conditional import ConditionalSoftmax, ConditionalSoftmaxLoss, huffman_tree
from hiercls.losses.leaf import (
    HXELoss,
    LeafCrossEntropy,
    SoftLabelLoss,
    hxe_weights,
    max_leaf_distance,
    soft_label_targets,
)
from hiercls.losses.multilabel import HierarchicalBCELoss, close_targets, mcm_logits
from hiercls.losses.nested import NestedRegionLoss, NestedSigmoid, node_ids_to_regions, soft_dice_loss
from hiercls.losses.semantic import SemanticKDLoss, SemanticLayout, SemanticSoftmaxLoss, semantic_level_weights
from hiercls.losses.validation import check_features, check_leaf_distribution, check_node_targets, is_soft_targets
from hiercls.taxonomy.tensors import TreeOps, segment_logsumexp

__all__ = [
    "ChainedSoftmax",
    "ConditionalSoftmax",
    "ConditionalSoftmaxLoss",
    "HXELoss",
    "HierarchicalBCELoss",
    "LeafCrossEntropy",
    "NestedRegionLoss",
    "NestedSigmoid",
    "SemanticKDLoss",
    "SemanticLayout",
    "SemanticSoftmaxLoss",
    "SoftLabelLoss",
    "TreeOps",
    "check_features",
    "check_leaf_distribution",
    "check_node_targets",
    "close_targets",
    "huffman_tree",
    "hxe_weights",
    "is_soft_targets",
    "max_leaf_distance",
    "mcm_logits",
    "node_ids_to_regions",
    "segment_logsumexp",
    "semantic_level_weights",
    "soft_dice_loss",
    "soft_label_targets",
]
