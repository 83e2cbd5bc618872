"""hiercls: hierarchical classification of images and text.

The data flow is taxonomy -> head -> loss (training) / node probabilities -> decoder -> metrics. Importing
``hiercls`` loads nothing else, so the command line answers at once; the ``transformers`` pipeline is
``hiercls.models.hf.pipeline`` (importing :mod:`hiercls.models.hf` registers hiercls with ``AutoModel``).
"""

__version__ = "0.1.0"
