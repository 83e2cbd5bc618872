"""hiercls: hierarchical classification of images and text.

The data flow is taxonomy -> head -> loss (training) / node probabilities -> decoder -> metrics.
"""

from typing import Any

__version__ = "0.1.0"


def pipeline(model: Any, **kwargs: Any) -> Any:
    """The ``hierarchical-classification`` pipeline (transformers) for a saved folder or a model in memory.

    :func:`hiercls.models.hf.pipeline` (importing it registers hiercls with ``AutoConfig``/``AutoModel`` and
    ``transformers.pipeline``); each input gives ``{"prediction", "path", "top_k"}`` as ``hiercls predict`` does.
    """
    from hiercls.models.hf import pipeline as hf_pipeline

    return hf_pipeline(model, **kwargs)
