"""Hierarchical heads: features -> logits -> (loss, node probabilities ``[B, N]``).

Build one by name with :func:`create_head` (``list_heads()`` shows the names); every head follows the
:class:`HierarchicalHead` contract of ``docs/architecture.md``.
"""

from hiercls.heads.base import HeadOutput, HierarchicalHead, check_features, check_node_targets
from hiercls.heads.conditional import ConditionalSoftmaxHead

# Importing the head modules registers them.
from hiercls.heads.flat import FlatSoftmaxHead, HXEHead, SoftLabelHead, leaf_probs_to_node_probs
from hiercls.heads.multilabel import MultiLabelHead
from hiercls.heads.nested import NestedSigmoidHead, node_ids_to_regions
from hiercls.heads.registry import create_head, get_head_class, list_heads, register_head, unregister_head
from hiercls.heads.semantic import SemanticSoftmaxHead

__all__ = [
    "ConditionalSoftmaxHead",
    "FlatSoftmaxHead",
    "HXEHead",
    "HeadOutput",
    "HierarchicalHead",
    "MultiLabelHead",
    "NestedSigmoidHead",
    "SemanticSoftmaxHead",
    "SoftLabelHead",
    "check_features",
    "check_node_targets",
    "create_head",
    "get_head_class",
    "leaf_probs_to_node_probs",
    "list_heads",
    "node_ids_to_regions",
    "register_head",
    "unregister_head",
]
