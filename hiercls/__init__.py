"""hiercls: hierarchical classification of images and text.

The data flow is taxonomy -> head -> loss (training) / node probabilities -> decoder -> metrics. Importing
``hiercls`` loads nothing else, so the command line answers at once; the ``transformers`` pipeline is
``hiercls.models.hf.pipeline``. Once ``transformers`` loads its Auto classes, hiercls registers with them
(:mod:`hiercls._autoregister`), so ``AutoModel.from_pretrained(folder)`` reads hiercls folders after a plain
``import hiercls``.
"""

from hiercls._autoregister import install

__version__ = "0.1.0"

install()
