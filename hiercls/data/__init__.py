"""Datasets (images, text, Fashion-MNIST, the WordNet gloss set, synthetic sets), the dataset registry, label
encoding and resumable DDP loaders.

Every dataset yields ``(input, node_id)`` against a :class:`~hiercls.taxonomy.Taxonomy` (text data sets with
label sets: ``(text, multi-hot [N])``, see :class:`~hiercls.data.text.HierTextDataset`); models supply the
collate function (stacking images, tokenising text). Recipes name a data set kind of :data:`DATASETS`
(:func:`build_dataset`).
"""

from hiercls.data.datasets import (
    DATASETS,
    DatasetBuilder,
    DatasetKind,
    build_dataset,
    dataset_taxonomy,
    list_datasets,
    register_dataset,
    subsample,
)
from hiercls.data.images import (
    AUGMENT_OPTIONS,
    FASHION_MNIST_CLASSES,
    FashionMNIST,
    HierImageFolder,
    ImageModeTransform,
    augment_options,
    fashion_mnist_taxonomy,
    image_transform,
    read_idx,
)
from hiercls.data.labels import LabelEncoder, LabelFormat
from hiercls.data.sampler import ResumableDataLoader, ResumableDistributedSampler, make_loader
from hiercls.data.synthetic import NestedBlobs3D, SyntheticHierarchy, nested_blobs_taxonomy
from hiercls.data.text import HierTextDataset
from hiercls.data.wordnet_gloss import gloss_split_of, load_timm_glosses, wordnet_gloss_dataset

__all__ = [
    "AUGMENT_OPTIONS",
    "DATASETS",
    "FASHION_MNIST_CLASSES",
    "DatasetBuilder",
    "DatasetKind",
    "FashionMNIST",
    "HierImageFolder",
    "HierTextDataset",
    "ImageModeTransform",
    "LabelEncoder",
    "LabelFormat",
    "NestedBlobs3D",
    "ResumableDataLoader",
    "ResumableDistributedSampler",
    "SyntheticHierarchy",
    "augment_options",
    "build_dataset",
    "dataset_taxonomy",
    "fashion_mnist_taxonomy",
    "gloss_split_of",
    "image_transform",
    "list_datasets",
    "load_timm_glosses",
    "make_loader",
    "nested_blobs_taxonomy",
    "read_idx",
    "register_dataset",
    "subsample",
    "wordnet_gloss_dataset",
]
