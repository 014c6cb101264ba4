"""The model transform of fast CPU inference: a copy of a model whose linear layers are packed
once for oneDNN (:class:`~aiayn.inference.kernels.PackedLinear`), and the rule of which products
keep PyTorch's kernel.

The rule: while a decoding step's weights stay in cache (at most a share of the last-level
cache, :attr:`~aiayn.settings.PerformanceSettings.step_weights_max_cache_share`), small products
(:func:`~aiayn.inference.kernels.small_product`) keep PyTorch's kernel, cheap for a few rows;
when the step's weights do not stay there, every product uses oneDNN, which reads a weight on
all threads where PyTorch's one-row product may use one. The measurements behind it, per call
and end to end: docs/performance.md ("Tuned thresholds").

:func:`pack_for_inference` returns a copy of a model whose ``nn.Linear`` layers are
:class:`~aiayn.inference.kernels.PackedLinear`: CPU, fp32, inference only (no gradients; the
packed weights cannot be saved or trained; the copy's other parameters do not require grad, so
it runs in any grad mode). The model passed in is not changed.

Shape legend:  D_in input size   D_out output size   I = H·d_k (attention's inner size)
"""

from __future__ import annotations

import copy
import os
from typing import TypeVar

import torch
from torch import nn

from aiayn.attention import CrossAttention, MultiHeadAttention, SelfAttention
from aiayn.inference.kernels import PackedLinear, packing_available
from aiayn.settings import performance

M = TypeVar("M", bound=nn.Module)


def pack_for_inference(model: M, *, dense_small: bool | None = None) -> M:
    """A copy of ``model`` (fp32, on CPU) with every ``nn.Linear`` packed for inference.

    Multi-head attention layers also get the row blocks of W^Q; W^K; W^V that they project with
    (cross-attention: queries, and keys/values; self-attention: none). Returns ``model`` itself,
    unchanged, where packing is unavailable (a build without oneDNN) or the model is not fp32 on
    CPU.

    Args:
        model: the model to copy.
        dense_small: whether small products keep PyTorch's kernel (see
            :class:`~aiayn.inference.kernels.PackedLinear`). None (default):
            :func:`step_weights_stay_in_cache`.
    """
    first = next(model.parameters(), None)
    if not packing_available() or first is None or first.device.type != "cpu":
        return model
    if first.dtype != torch.float32:
        return model
    if dense_small is None:
        dense_small = step_weights_stay_in_cache(model)
    packed = copy.deepcopy(model).eval().requires_grad_(False)  # usable without torch.no_grad
    for module in list(packed.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                rows = _row_blocks(module) if name == "in_proj" else ()
                setattr(module, name, PackedLinear(child, rows, dense_small=dense_small))
    return packed


def step_weights_stay_in_cache(model: nn.Module) -> bool:
    """The default of ``dense_small``: a decoding step's weights take at most
    :attr:`~aiayn.settings.PerformanceSettings.step_weights_max_cache_share` of the last-level
    cache."""
    share = performance().step_weights_max_cache_share
    return step_weight_bytes(model) <= share * last_level_cache_bytes()


def step_weight_bytes(model: nn.Module) -> int:
    """Bytes of the linear-layer weights on the decoding side: every ``nn.Linear`` outside a
    child module named ``encoder`` (which runs once per source), shared weights counted once. An
    upper bound on what one step reads (cross-attention reads its key/value rows once per
    source)."""
    seen: dict[int, int] = {}
    for name, module in model.named_modules():
        if type(module) is nn.Linear and "encoder" not in name.split("."):
            w = module.weight
            seen[id(w)] = w.numel() * w.element_size()
    return sum(seen.values())


def last_level_cache_bytes() -> int:
    """Size of the CPU's last-level cache (L3, else L2) as the OS reports it, else
    :attr:`~aiayn.settings.PerformanceSettings.default_last_level_cache_bytes`."""
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            size = os.sysconf(name)
        except (ValueError, OSError):  # not a name this OS knows
            continue
        if size > 0:
            return size
    return performance().default_last_level_cache_bytes


def _row_blocks(module: nn.Module) -> tuple[slice, ...]:
    """The blocks of the stacked rows [W^Q; W^K; W^V] that ``module`` projects with alone."""
    if isinstance(module, SelfAttention) or not isinstance(module, MultiHeadAttention):
        return ()  # Q, K and V in one matmul
    d = module.inner_dim  # I = H·d_k
    query, key_value = slice(0, d), slice(d, 3 * d)
    if isinstance(module, CrossAttention):
        return (query, key_value)
    return (query, key_value, slice(d, 2 * d), slice(2 * d, 3 * d))  # key is not value
