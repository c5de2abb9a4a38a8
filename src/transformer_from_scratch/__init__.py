"""Transformer LM from scratch: the components built in the course notebooks.

Each module is generated from its notebook (``notebooks/01_linear.ipynb`` -> ``linear.py``);
edit the notebook, not the module. ``export`` and ``interactive`` are the course's own tools.
"""

from .linear import Linear
from .embedding import Embedding
from .softmax import softmax
from .rmsnorm import RMSNorm
from .attention import scaled_dot_product_attention

__all__ = ["Linear", "Embedding", "softmax", "RMSNorm", "scaled_dot_product_attention"]
