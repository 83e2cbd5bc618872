"""Datasets (images, text, Fashion-MNIST, the WordNet gloss set), label encoding and resumable DDP loaders.

Every dataset yields ``(input, node_id)`` against a :class:`~hiercls.taxonomy.Taxonomy`; models supply the
collate function (stacking images, tokenising text).
"""

from hiercls.data.images import FASHION_MNIST_CLASSES, FashionMNIST, HierImageFolder, fashion_mnist_taxonomy, read_idx
from hiercls.data.labels import LabelEncoder, LabelFormat
from hiercls.data.sampler import ResumableDataLoader, ResumableDistributedSampler, make_loader
from hiercls.data.text import HierTextDataset
from hiercls.data.wordnet_gloss import gloss_split_of, load_timm_glosses, wordnet_gloss_dataset

__all__ = [
    "FASHION_MNIST_CLASSES",
    "FashionMNIST",
    "HierImageFolder",
    "HierTextDataset",
    "LabelEncoder",
    "LabelFormat",
    "ResumableDataLoader",
    "ResumableDistributedSampler",
    "fashion_mnist_taxonomy",
    "gloss_split_of",
    "load_timm_glosses",
    "make_loader",
    "read_idx",
    "wordnet_gloss_dataset",
]
