"""hiercls: hierarchical classification of images and text.

The data flow is taxonomy -> head -> loss (training) / node probabilities -> decoder -> metrics.
"""

__version__ = "0.1.0"
