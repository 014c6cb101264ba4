"""Inference: running a model fast, without a search. Linear layers packed once for oneDNN
(:mod:`~aiayn.inference.packed`), the kernels the flattened paths share
(:mod:`~aiayn.inference.kernels`), encoders on their real tokens only
(:mod:`~aiayn.inference.encoder`), and what encoder-only models are used for (fill-mask,
sentence embeddings, text classification)."""

from aiayn.inference.kernels import PackedLinear, packing_available
from aiayn.inference.packed import pack_for_inference

__all__ = ["PackedLinear", "pack_for_inference", "packing_available"]
