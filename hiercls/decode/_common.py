"""The names earlier versions of the decoders imported from here (now in :mod:`hiercls.decode.inputs`)."""

from hiercls.decode.inputs import (
    CHUNK_ELEMENTS,
    Batch,
    chunked,
    index_tensor,
    label_distribution,
    prepare,
    restore_ids,
    restore_sets,
    restore_values,
)

__all__ = [
    "CHUNK_ELEMENTS",
    "Batch",
    "chunked",
    "index_tensor",
    "label_distribution",
    "prepare",
    "restore_ids",
    "restore_sets",
    "restore_values",
]
