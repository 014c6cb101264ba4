"""Self-attention of a small example, step by step and with the numbers (``aiayn explain``).

:func:`build_trace` computes every intermediate of one multi-head self-attention layer with
plain, explicit tensor arithmetic and returns them in an :class:`AttentionTrace`;
:func:`format_trace` turns a trace into text; :func:`check_trace` recomputes the result with
the library's own :class:`aiayn.attention.SelfAttention` (which goes through
:func:`aiayn.attention.scaled_dot_product_attention` with ``need_weights=True``) and reports how
far the two are apart.

The steps, with the paper's sections:

1. token embeddings, multiplied by √d_model (§3.4);
2. sinusoidal positional encodings (§3.5);
3. X = embeddings + PE (§3.5);
4. per head h (§3.2.2): Q_h = X W_Q[:, h·d_k:(h+1)·d_k], K_h, V_h likewise; the scores
   Q_h K_hᵀ; scaled by 1/√d_k; the causal mask if asked (§3.2.3); the softmax of each row;
   head_h = weights · V_h (§3.2.1, eq. 1);
5. Concat(head_1, …, head_H) (§3.2.2);
6. output = Concat · W_O (§3.2.2).

Every matrix W is (D, D) and used as ``x @ W`` (rows = inputs), as in the paper.

Defaults, chosen so the arithmetic can be redone by hand: one-hot-style embeddings (the i-th
distinct token gets the unit vector e_(i mod D)), identity W_Q = W_K = W_V = W_O, positional
encodings and embedding scaling on. The trace is float64, the positional table included: it is
the formula of :func:`aiayn.layers.sinusoidal_encoding` evaluated in float64 (that function
returns float32, whose rounding can show at 4 decimals: cos(0.01) = 0.99995000 is 0.99994999
in float32); :func:`check_trace` compares the two.

Shape legend:
    T    number of tokens (sequence length; queries and keys alike)
    D    d_model
    H    number of heads
    d_k  D / H, the per-head query/key size (= d_v, the per-head value size)
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from aiayn.attention import SelfAttention, causal_mask, scaled_dot_product_attention
from aiayn.errors import UserError
from aiayn.layers import sinusoidal_encoding
from aiayn.limits import (
    MAX_EXPLAIN_D_MODEL,
    MAX_EXPLAIN_HEADS,
    MAX_EXPLAIN_TOKENS,
    MAX_EXPLAIN_WEIGHTS_BYTES,
)

__all__ = [
    "DEFAULT_TOKENS",
    "WEIGHT_KEYS",
    "AttentionTrace",
    "ExplicitWeights",
    "TraceCheck",
    "build_trace",
    "check_trace",
    "format_matrix",
    "format_trace",
    "library_module",
    "load_weights",
    "parse_weights",
    "positional_table",
]

DEFAULT_TOKENS: tuple[str, ...] = ("The", "cat", "sat")
"""The default example sentence."""

WEIGHT_KEYS: tuple[str, ...] = ("W_Q", "W_K", "W_V", "W_O")
"""The projection matrices a weights file may give, each (D, D), used as ``x @ W``."""

_ALL_KEYS = ("embeddings", *WEIGHT_KEYS)
_DTYPE = torch.float64
_MAX_DECIMALS = 12
_CHECK_TOLERANCE = 1e-9  # float64 on both sides; real disagreements are far larger
_PE_TOLERANCE = 1e-6  # the library's PE table is float32


# -- inputs ------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ExplicitWeights:
    """Matrices given by the user (``--weights FILE.json``); ``None`` = use the default.

    Attributes:
        embeddings: (T, D) one row per token in sentence order, or a mapping token -> (D,) row.
        W_Q, W_K, W_V, W_O: (D, D) each, used as ``x @ W``.
        source: where they came from (a file name), for the printed header.
    """

    embeddings: Tensor | Mapping[str, Tensor] | None = None
    W_Q: Tensor | None = None
    W_K: Tensor | None = None
    W_V: Tensor | None = None
    W_O: Tensor | None = None
    source: str = "given weights"

    def matrix(self, key: str) -> Tensor | None:
        """The (D, D) matrix under ``key`` (one of :data:`WEIGHT_KEYS`), or None."""
        value: Tensor | None = getattr(self, key)
        return value

    def given(self) -> tuple[str, ...]:
        """The keys that were given, in the order of :data:`_ALL_KEYS`."""
        return tuple(key for key in _ALL_KEYS if getattr(self, key) is not None)

    def inferred_d_model(self) -> int | None:
        """D as implied by the given matrices (the first one found), or None if none given."""
        for key in WEIGHT_KEYS:
            matrix = self.matrix(key)
            if matrix is not None:
                return int(matrix.shape[0])
        if isinstance(self.embeddings, Tensor):
            return int(self.embeddings.shape[1])
        if isinstance(self.embeddings, Mapping) and self.embeddings:
            return int(next(iter(self.embeddings.values())).shape[0])
        return None


def _number(value: Any, where: str) -> float:
    """A finite JSON number as float; bools and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{where} must be a number, got {json.dumps(value)[:40]}")
    if not math.isfinite(value):
        raise UserError(f"{where} must be a finite number, got {value}")
    return float(value)


def _vector(value: Any, where: str) -> Tensor:
    """A JSON list of numbers -> (N,) float64 tensor."""
    if not isinstance(value, list) or not value:
        got = json.dumps(value)[:40]
        raise UserError(f"{where} must be a non-empty list of numbers, got {got}")
    return torch.tensor([_number(x, f"{where}[{i}]") for i, x in enumerate(value)], dtype=_DTYPE)


def _matrix(value: Any, where: str) -> Tensor:
    """A JSON list of equally long rows -> (R, C) float64 tensor."""
    if not isinstance(value, list) or not value:
        raise UserError(f"{where} must be a non-empty list of rows, got {json.dumps(value)[:40]}")
    rows = [_vector(row, f"{where}[{i}]") for i, row in enumerate(value)]
    widths = sorted({row.numel() for row in rows})
    if len(widths) > 1:
        raise UserError(f"{where} has rows of different lengths {widths}")
    return torch.stack(rows)  # R × (C,) -> (R, C)


def parse_weights(data: Any, source: str = "given weights") -> ExplicitWeights:
    """Check and convert decoded JSON (a dict) into :class:`ExplicitWeights`.

    Keys: ``"embeddings"`` (a list of rows, one per token, or a dict token -> row) and any of
    ``"W_Q"``, ``"W_K"``, ``"W_V"``, ``"W_O"`` (lists of rows). Missing keys mean "default".
    Square shapes are checked here; agreement with d_model and the tokens in :func:`build_trace`.

    Raises:
        UserError: naming the bad key or value.
    """
    if not isinstance(data, dict):
        raise UserError(
            f"{source}: expected a JSON object with keys {', '.join(_ALL_KEYS)}, "
            f"got {type(data).__name__}"
        )
    unknown = sorted(set(data) - set(_ALL_KEYS))
    if unknown:
        raise UserError(
            f"{source}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"expected some of {', '.join(_ALL_KEYS)}"
        )
    embeddings: Tensor | dict[str, Tensor] | None = None
    raw = data.get("embeddings")
    if isinstance(raw, dict):
        if not raw:
            raise UserError(f"{source}: 'embeddings' is an empty object")
        embeddings = {
            str(token): _vector(row, f"{source}: embeddings[{token!r}]")
            for token, row in raw.items()
        }
        widths = sorted({row.numel() for row in embeddings.values()})
        if len(widths) > 1:
            raise UserError(f"{source}: embeddings rows have different lengths {widths}")
    elif raw is not None:
        embeddings = _matrix(raw, f"{source}: embeddings")
    matrices: dict[str, Tensor | None] = {}
    for key in WEIGHT_KEYS:
        matrices[key] = None if data.get(key) is None else _matrix(data[key], f"{source}: {key}")
        matrix = matrices[key]
        if matrix is not None and matrix.shape[0] != matrix.shape[1]:
            rows, cols = matrix.shape
            raise UserError(f"{source}: {key} must be square (d_model×d_model), got {rows}×{cols}")
    return ExplicitWeights(embeddings=embeddings, source=source, **matrices)


def load_weights(path: str | Path) -> ExplicitWeights:
    """Read a JSON weights file (format: :func:`parse_weights`).

    Raises:
        UserError: the file cannot be read, is not JSON, or holds a malformed matrix.
    """
    path = Path(path)
    try:
        text = _read_bounded(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise UserError(f"cannot read weights file {str(path)!r}: {reason}") from error
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(
            f"weights file {str(path)!r} is not valid JSON: {error.msg} "
            f"(line {error.lineno}, column {error.colno})"
        ) from error
    return parse_weights(data, source=str(path))


def _read_bounded(path: Path) -> bytes:
    """The bytes of ``path``, a regular file (not a FIFO or device, whose reading may never end)
    of at most :data:`~aiayn.limits.MAX_EXPLAIN_WEIGHTS_BYTES`."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"cannot read weights file {str(path)!r}: not a regular file")
        data = handle.read(MAX_EXPLAIN_WEIGHTS_BYTES + 1)
    if len(data) > MAX_EXPLAIN_WEIGHTS_BYTES:
        raise UserError(
            f"weights file {str(path)!r} is larger than {MAX_EXPLAIN_WEIGHTS_BYTES:,} bytes "
            "(aiayn.limits.MAX_EXPLAIN_WEIGHTS_BYTES)"
        )
    return data


# -- the trace ---------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class AttentionTrace:
    """Every intermediate of one multi-head self-attention layer (float64 tensors).

    Attributes:
        tokens: the T tokens.
        d_model, num_heads, d_k: D, H and d_k = D / H.
        positional, scale_embeddings, causal: which optional steps were applied.
        sources: for "embeddings" and each of W_Q, W_K, W_V, W_O: where it came from
            ("default", "seed 0", or a file name).
        seed: the random seed, or None.
        embeddings: (T, D) token embeddings before scaling.
        embedding_scale: √D if ``scale_embeddings`` else 1.
        scaled_embeddings: (T, D) embeddings × ``embedding_scale``.
        positional_encoding: (T, D) the §3.5 table (zeros if ``positional`` is off).
        x: (T, D) the attention input, scaled embeddings + PE.
        W_Q, W_K, W_V, W_O: (D, D) projections, used as ``x @ W``.
        q, k, v: (H, T, d_k) per-head projections.
        scores: (H, T, T) Q_h K_hᵀ, rows = queries, columns = keys.
        sqrt_d_k: √d_k.
        scaled_scores: (H, T, T) scores / √d_k.
        mask: (T, T) boolean, True = may attend; None without ``causal``.
        masked_scores: (H, T, T) scaled scores with blocked entries at −∞ (= scaled_scores
            without a mask).
        weights: (H, T, T) softmax of each row of ``masked_scores``.
        heads: (H, T, d_k) weights @ V_h.
        concat: (T, D) the heads side by side.
        output: (T, D) concat @ W_O.
    """

    tokens: tuple[str, ...]
    d_model: int
    num_heads: int
    d_k: int
    positional: bool
    scale_embeddings: bool
    causal: bool
    seed: int | None
    sources: Mapping[str, str]
    embeddings: Tensor
    embedding_scale: float
    scaled_embeddings: Tensor
    positional_encoding: Tensor
    x: Tensor
    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    scores: Tensor
    sqrt_d_k: float
    scaled_scores: Tensor
    mask: Tensor | None
    masked_scores: Tensor
    weights: Tensor
    heads: Tensor
    concat: Tensor
    output: Tensor = field(repr=False)

    @property
    def num_tokens(self) -> int:
        """T."""
        return len(self.tokens)


def _validate_sizes(tokens: Sequence[str], d_model: int, num_heads: int) -> None:
    if not tokens:
        raise UserError("no tokens: give at least one, e.g. --tokens 'The cat sat'")
    for what, value, limit, name in (
        ("tokens", len(tokens), MAX_EXPLAIN_TOKENS, "MAX_EXPLAIN_TOKENS"),
        ("d_model", d_model, MAX_EXPLAIN_D_MODEL, "MAX_EXPLAIN_D_MODEL"),
        ("heads", num_heads, MAX_EXPLAIN_HEADS, "MAX_EXPLAIN_HEADS"),
    ):
        if value > limit:
            raise UserError(
                f"{what}={value:,} is more than explain traces (at most {limit}, "
                f"aiayn.limits.{name}): it prints every number of a small example"
            )
    if d_model < 1:
        raise UserError(f"d_model must be at least 1, got d_model={d_model}")
    if num_heads < 1:
        raise UserError(f"heads must be at least 1, got heads={num_heads}")
    if d_model % num_heads != 0:
        raise UserError(
            f"heads={num_heads} does not divide d_model={d_model} "
            "(each head gets d_k = d_model / heads columns, §3.2.2)"
        )


def positional_table(length: int, d_model: int) -> Tensor:
    """The sinusoidal table of §3.5 in float64, (length, D); same formula as
    :func:`aiayn.layers.sinusoidal_encoding` (which returns it rounded to float32).
    """
    position = torch.arange(length, dtype=_DTYPE)[:, None]  # (T, 1)
    two_i = torch.arange(0, d_model, 2, dtype=_DTYPE)  # (⌈D/2⌉,)
    angle = position / (10000.0 ** (two_i / d_model))  # (T, 1) / (⌈D/2⌉,) -> (T, ⌈D/2⌉)
    table = torch.zeros(length, d_model, dtype=_DTYPE)  # (T, D)
    table[:, 0::2] = torch.sin(angle)  # even columns 2i
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # odd columns 2i+1
    return table


def _generator(seed: int) -> torch.Generator:
    """A private generator (the global RNG is left alone)."""
    if not 0 <= seed < 2**64:
        raise UserError(f"seed={seed} is out of range: use an integer in [0, 2**64)")
    return torch.Generator().manual_seed(seed)


def _default_embeddings(
    vocabulary: Sequence[str], d_model: int, generator: torch.Generator | None
) -> dict[str, Tensor]:
    """One row per distinct token: e_(i mod D) for the i-th, or N(0, 1/D) with a generator."""
    if generator is None:
        eye = torch.eye(d_model, dtype=_DTYPE)  # (D, D)
        return {token: eye[i % d_model] for i, token in enumerate(vocabulary)}
    table = torch.randn(len(vocabulary), d_model, generator=generator, dtype=_DTYPE)  # (V, D)
    table = table / math.sqrt(d_model)
    return dict(zip(vocabulary, table, strict=True))


def _resolve_embeddings(
    tokens: Sequence[str],
    d_model: int,
    given: Tensor | Mapping[str, Tensor] | None,
    default: Mapping[str, Tensor],
    source: str,
) -> Tensor:
    """The (T, D) embedding matrix, from the given rows or the default table."""
    if given is None:
        return torch.stack([default[token] for token in tokens])  # T × (D,) -> (T, D)
    if isinstance(given, Tensor):
        rows, cols = given.shape
        if rows != len(tokens) or cols != d_model:
            raise UserError(
                f"{source}: embeddings must be {len(tokens)}×{d_model} (one row of d_model "
                f"numbers per token {list(tokens)}), got {rows}×{cols}"
            )
        return given.to(_DTYPE)
    missing = [token for token in dict.fromkeys(tokens) if token not in given]
    if missing:
        raise UserError(
            f"{source}: embeddings has no row for token(s) {', '.join(map(repr, missing))}"
        )
    for token in dict.fromkeys(tokens):
        if given[token].numel() != d_model:
            raise UserError(
                f"{source}: embeddings[{token!r}] must have d_model={d_model} numbers, "
                f"got {given[token].numel()}"
            )
    return torch.stack([given[token].to(_DTYPE) for token in tokens])  # T × (D,) -> (T, D)


class _AttentionInput(NamedTuple):
    """Steps 1–3 (§3.4, §3.5), named as the fields of :class:`AttentionTrace`."""

    embeddings: Tensor  # (T, D)
    embedding_scale: float
    scaled_embeddings: Tensor  # (T, D)
    positional_encoding: Tensor  # (T, D)
    x: Tensor  # (T, D)


class _Attention(NamedTuple):
    """Step 4 (§3.2.1, §3.2.2), named as the fields of :class:`AttentionTrace`."""

    q: Tensor  # (H, T, d_k)
    k: Tensor  # (H, T, d_k)
    v: Tensor  # (H, T, d_k)
    scores: Tensor  # (H, T, T)
    sqrt_d_k: float
    scaled_scores: Tensor  # (H, T, T)
    mask: Tensor | None  # (T, T)
    masked_scores: Tensor  # (H, T, T)
    weights: Tensor  # (H, T, T)
    heads: Tensor  # (H, T, d_k)


def _sources(seed: int | None, given: ExplicitWeights) -> dict[str, str]:
    """Where "embeddings" and each of W_Q, W_K, W_V, W_O come from: "default", "seed N", or
    the given weights' source."""
    default_source = "default" if seed is None else f"seed {seed}"
    sources = {key: default_source for key in _ALL_KEYS}
    for key in given.given():
        sources[key] = given.source
    return sources


def _default_matrices(d_model: int, generator: torch.Generator | None) -> dict[str, Tensor]:
    """W_Q, W_K, W_V, W_O, each (D, D): identities, or N(0, 1/D) drawn in that order."""
    matrices: dict[str, Tensor] = {}
    for key in WEIGHT_KEYS:
        if generator is None:
            matrices[key] = torch.eye(d_model, dtype=_DTYPE)  # (D, D)
        else:
            drawn = torch.randn(d_model, d_model, generator=generator, dtype=_DTYPE)  # (D, D)
            matrices[key] = drawn / math.sqrt(d_model)
    return matrices


def _given_matrix(given: ExplicitWeights, key: str, d_model: int) -> Tensor | None:
    """The (D, D) matrix ``given`` has under ``key``, in float64, or None if none."""
    matrix = given.matrix(key)
    if matrix is None:
        return None
    if tuple(matrix.shape) != (d_model, d_model):
        rows, cols = matrix.shape
        raise UserError(
            f"{given.source}: {key} must be {d_model}×{d_model} (d_model×d_model), "
            f"got {rows}×{cols}"
        )
    return matrix.to(_DTYPE)


def _resolve_weights(
    tokens: Sequence[str], d_model: int, seed: int | None, given: ExplicitWeights
) -> tuple[dict[str, Tensor], Tensor]:
    """The four (D, D) projections by name and the (T, D) embeddings: the given ones, else the
    defaults (identities and one-hot rows, or random normal from ``seed``)."""
    generator = None if seed is None else _generator(seed)
    vocabulary = tuple(dict.fromkeys(tokens))  # distinct tokens, in order of first appearance
    # Drawn first and always all four (also when some are given), so a seed gives the same
    # matrices whatever the tokens and the weights file; the embeddings come after.
    matrices = _default_matrices(d_model, generator)
    default_table = _default_embeddings(vocabulary, d_model, generator)
    for key in WEIGHT_KEYS:
        matrix = _given_matrix(given, key, d_model)
        if matrix is not None:
            matrices[key] = matrix
    embeddings = _resolve_embeddings(
        tokens, d_model, given.embeddings, default_table, given.source
    )  # (T, D)
    return matrices, embeddings


def _attention_input(
    embeddings: Tensor, *, positional: bool, scale_embeddings: bool
) -> _AttentionInput:
    """Steps 1–3: X = embeddings × √D (if ``scale_embeddings``, §3.4) + PE (if
    ``positional``, §3.5); ``embeddings`` is (T, D)."""
    t, d_model = embeddings.shape
    embedding_scale = math.sqrt(d_model) if scale_embeddings else 1.0
    scaled_embeddings = embeddings * embedding_scale  # (T, D)
    no_pe = torch.zeros(t, d_model, dtype=_DTYPE)  # (T, D)
    pe = positional_table(t, d_model) if positional else no_pe  # (T, D)
    x = scaled_embeddings + pe  # (T, D)
    return _AttentionInput(embeddings, embedding_scale, scaled_embeddings, pe, x)


def _per_head(x: Tensor, w: Tensor, num_heads: int) -> Tensor:
    """x @ w split into heads: head h is columns h·d_k:(h+1)·d_k. (T, D) -> (H, T, d_k)."""
    t, d_model = x.shape
    projected = x @ w  # (T, D) @ (D, D) -> (T, D)
    split = projected.view(t, num_heads, d_model // num_heads)  # (T, D) -> (T, H, d_k)
    return split.transpose(0, 1).contiguous()  # (T, H, d_k) -> (H, T, d_k)


def _softmax_rows(scores: Tensor) -> Tensor:
    """Softmax by hand: exp(s - max) / Σ exp(s - max) over the keys of each row (eq. 1).

    (H, T, T) -> (H, T, T); a −∞ score (a blocked key) gets weight exp(−∞) = 0.
    """
    shifted = scores - scores.amax(dim=-1, keepdim=True)  # (H, T, T)
    exp = shifted.exp()  # (H, T, T); exp(−∞) = 0 for blocked keys
    return exp / exp.sum(dim=-1, keepdim=True)  # (H, T, T) / (H, T, 1)


def _attend(x: Tensor, matrices: Mapping[str, Tensor], num_heads: int, causal: bool) -> _Attention:
    """Step 4: per head, Q, K, V, the scores, scaled by 1/√d_k, masked if ``causal`` (§3.2.3),
    the softmax and the weighted sum of V (§3.2.1, eq. 1). ``x`` is (T, D)."""
    t = x.shape[0]
    q, k, v = (_per_head(x, matrices[key], num_heads) for key in ("W_Q", "W_K", "W_V"))
    scores = q @ k.transpose(-2, -1)  # (H, T, d_k) @ (H, d_k, T) -> (H, T, T)
    sqrt_d_k = math.sqrt(q.shape[-1])
    scaled_scores = scores / sqrt_d_k  # (H, T, T)
    mask: Tensor | None = None
    masked_scores = scaled_scores
    if causal:
        mask = causal_mask(t)[0, 0]  # (1, 1, T, T) -> (T, T)
        masked_scores = scaled_scores.masked_fill(~mask, -math.inf)  # (H, T, T)
    weights = _softmax_rows(masked_scores)  # (H, T, T)
    heads = weights @ v  # (H, T, T) @ (H, T, d_k) -> (H, T, d_k)
    return _Attention(q, k, v, scores, sqrt_d_k, scaled_scores, mask, masked_scores, weights, heads)


def _concat_and_project(heads: Tensor, w_o: Tensor) -> tuple[Tensor, Tensor]:
    """Steps 5–6: Concat(head_1, …, head_H) and Concat · W_O (§3.2.2).

    heads (H, T, d_k), w_o (D, D) -> concat (T, D), output (T, D).
    """
    num_heads, t, d_k = heads.shape
    # (H, T, d_k) -> (T, H, d_k) -> (T, D)
    concat = heads.transpose(0, 1).reshape(t, num_heads * d_k)
    return concat, concat @ w_o  # (T, D) @ (D, D) -> (T, D)


def build_trace(
    tokens: Sequence[str] = DEFAULT_TOKENS,
    *,
    d_model: int | None = None,
    num_heads: int = 2,
    seed: int | None = None,
    weights: ExplicitWeights | None = None,
    positional: bool = True,
    scale_embeddings: bool = True,
    causal: bool = False,
) -> AttentionTrace:
    """Compute self-attention of ``tokens`` step by step, with explicit arithmetic.

    Args:
        tokens: the T tokens (the i-th distinct one gets the i-th default embedding row).
        d_model: D; None = taken from ``weights`` if they give a matrix, else 4.
        num_heads: H; must divide D.
        seed: if given, default embeddings and W_Q, W_K, W_V, W_O are random normal from this
            seed, with standard deviation 1/√D; otherwise one-hot embeddings and identities.
        weights: explicit matrices; each one given replaces its default.
        positional: add the sinusoidal positional encodings of §3.5.
        scale_embeddings: multiply the embeddings by √d_model (§3.4).
        causal: apply the decoder's causal mask (§3.2.3).

    Returns:
        The :class:`AttentionTrace`.

    Raises:
        UserError: no tokens, D < 1, H < 1, H not dividing D, or a given matrix of the wrong
            shape.
    """
    tokens = tuple(tokens)
    given = weights or ExplicitWeights()
    if d_model is None:
        d_model = given.inferred_d_model() or 4
    _validate_sizes(tokens, d_model, num_heads)
    matrices, embeddings = _resolve_weights(tokens, d_model, seed, given)
    inputs = _attention_input(embeddings, positional=positional, scale_embeddings=scale_embeddings)
    attention = _attend(inputs.x, matrices, num_heads, causal)
    concat, output = _concat_and_project(attention.heads, matrices["W_O"])
    return AttentionTrace(
        tokens=tokens,
        d_model=d_model,
        num_heads=num_heads,
        d_k=d_model // num_heads,
        positional=positional,
        scale_embeddings=scale_embeddings,
        causal=causal,
        seed=seed,
        sources=_sources(seed, given),
        W_Q=matrices["W_Q"],
        W_K=matrices["W_K"],
        W_V=matrices["W_V"],
        W_O=matrices["W_O"],
        concat=concat,
        output=output,
        **inputs._asdict(),
        **attention._asdict(),
    )


# -- the library check -------------------------------------------------------------------------
@dataclass(frozen=True)
class TraceCheck:
    """How far the library's computation is from the trace's explicit arithmetic.

    Attributes:
        module: the library module the output was compared with.
        output_max_abs_diff: max |module output − trace output| over (T, D).
        weights_max_abs_diff: max |module weights − trace weights| over (H, T, T).
        heads_max_abs_diff: max |scaled_dot_product_attention(Q, K, V) − trace heads| over
            (H, T, d_k), from the trace's own Q, K, V.
        positional_max_abs_diff: max |aiayn.layers.sinusoidal_encoding − trace PE| over (T, D)
            (0 when positional encoding is off).
        tolerance: the largest difference that still counts as equal (float64 vs float64).
        positional_tolerance: the same for the PE table, which the library gives in float32.
    """

    module: str
    output_max_abs_diff: float
    weights_max_abs_diff: float
    heads_max_abs_diff: float
    positional_max_abs_diff: float = 0.0
    tolerance: float = _CHECK_TOLERANCE
    positional_tolerance: float = _PE_TOLERANCE

    @property
    def max_abs_diff(self) -> float:
        """The largest of the three differences."""
        return max(self.output_max_abs_diff, self.weights_max_abs_diff, self.heads_max_abs_diff)

    @property
    def passed(self) -> bool:
        """True if every difference is within its tolerance."""
        return (
            self.max_abs_diff <= self.tolerance
            and self.positional_max_abs_diff <= self.positional_tolerance
        )


def library_module(trace: AttentionTrace) -> SelfAttention:
    """A float64 :class:`aiayn.attention.SelfAttention` holding the trace's W matrices.

    ``nn.Linear`` computes ``x @ weight.T + bias``, so ``in_proj.weight`` is
    ``cat([W_Qᵀ, W_Kᵀ, W_Vᵀ])`` (3D, D), ``out_proj.weight`` is ``W_Oᵀ`` and the biases are 0.
    """
    module = SelfAttention(trace.d_model, trace.num_heads).double().eval()
    with torch.no_grad():
        in_proj = torch.cat([trace.W_Q.T, trace.W_K.T, trace.W_V.T])  # 3 × (D, D) -> (3D, D)
        module.in_proj.weight.copy_(in_proj)
        module.out_proj.weight.copy_(trace.W_O.T)  # (D, D)
        for layer in (module.in_proj, module.out_proj):
            if layer.bias is not None:
                layer.bias.zero_()
    return module


def check_trace(trace: AttentionTrace) -> TraceCheck:
    """Recompute the trace with the library and measure the differences.

    The output and the per-head weights come from :class:`aiayn.attention.SelfAttention` with
    the trace's matrices loaded (``need_weights=True``); the per-head outputs also from
    :func:`aiayn.attention.scaled_dot_product_attention` applied to the trace's Q, K, V; the
    positional table from :func:`aiayn.layers.sinusoidal_encoding`.
    """
    module = library_module(trace)
    mask = None if trace.mask is None else trace.mask[None, None]  # (T, T) -> (1, 1, T, T)
    with torch.no_grad():
        result = module(trace.x[None], mask, need_weights=True)  # (1, T, D) -> (1, T, D)
        heads, _ = scaled_dot_product_attention(
            trace.q[None], trace.k[None], trace.v[None], mask, need_weights=True
        )  # 3 × (1, H, T, d_k) -> (1, H, T, d_k)
    assert result.weights is not None
    pe_diff = 0.0
    if trace.positional:
        library_pe = sinusoidal_encoding(trace.num_tokens, trace.d_model).to(_DTYPE)  # (T, D)
        pe_diff = float((library_pe - trace.positional_encoding).abs().max())
    return TraceCheck(
        module="aiayn.attention.SelfAttention",
        output_max_abs_diff=float((result.output[0] - trace.output).abs().max()),
        weights_max_abs_diff=float((result.weights[0] - trace.weights).abs().max()),
        heads_max_abs_diff=float((heads[0] - trace.heads).abs().max()),
        positional_max_abs_diff=pe_diff,
    )


# -- text --------------------------------------------------------------------------------------
def _number_text(value: float, decimals: int) -> str:
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    text = f"{value:.{decimals}f}"
    if text.startswith("-") and float(text) == 0.0:
        text = text[1:]  # no "-0.0000"
    return text


def format_matrix(
    matrix: Tensor,
    row_labels: Sequence[str],
    column_labels: Sequence[str] | None = None,
    *,
    decimals: int = 4,
    indent: str = "    ",
) -> str:
    """A (R, C) matrix as aligned text with row labels and a header row of column labels.

    Boolean matrices are written as 1 (True) and 0 (False); −∞ as ``-inf``.
    """
    rows, cols = matrix.shape
    if column_labels is None:
        column_labels = [str(j) for j in range(cols)]
    if matrix.dtype == torch.bool:
        cells = [["1" if bool(matrix[i, j]) else "0" for j in range(cols)] for i in range(rows)]
    else:
        values = matrix.tolist()
        cells = [[_number_text(values[i][j], decimals) for j in range(cols)] for i in range(rows)]
    width = max([len(c) for row in cells for c in row] + [len(c) for c in column_labels])
    label_width = max(len(label) for label in row_labels)
    lines = [indent + " " * label_width + "".join(f"  {c:>{width}}" for c in column_labels)]
    for label, row in zip(row_labels, cells, strict=True):
        lines.append(indent + f"{label:<{label_width}}" + "".join(f"  {c:>{width}}" for c in row))
    return "\n".join(line.rstrip() for line in lines)


def _is_identity(matrix: Tensor) -> bool:
    return bool(torch.equal(matrix, torch.eye(matrix.size(0), dtype=matrix.dtype)))


def _matrix_block(
    m: Tensor, rows: Sequence[str], cols: Sequence[str] | None, decimals: int
) -> list[str]:
    """A matrix as text, then an empty line."""
    return [format_matrix(m, rows, cols, decimals=decimals), ""]


def _source_text(trace: AttentionTrace, key: str, default: str) -> str:
    """How ``key`` ("embeddings", "W_Q"…) was chosen: ``default``, the seed or the file."""
    source = trace.sources[key]
    if source == "default":
        return default
    if trace.seed is not None and source == f"seed {trace.seed}":
        return f"random normal (std 1/√{trace.d_model}) from seed {trace.seed}"
    return f"from {source}"


def _header_lines(trace: AttentionTrace, decimals: int) -> list[str]:
    """The header: every setting a reader needs to redo the arithmetic."""
    t, d, h, d_k = trace.num_tokens, trace.d_model, trace.num_heads, trace.d_k
    tokens_word = "token" if t == 1 else "tokens"
    heads_word = "head" if h == 1 else "heads"
    one_hot = f"default: one-hot, the i-th distinct token -> unit vector e_(i mod {d})"
    out = [
        f'Self-attention, step by step: "{" ".join(trace.tokens)}"',
        f"  T={t} {tokens_word}, D=d_model={d}, H={h} {heads_word}, d_k=d_v=D/H={d_k}",
        "  matrices are used as x @ W (rows = tokens); columns are labelled by index",
        f"  embeddings:          {_source_text(trace, 'embeddings', one_hot)}",
    ]
    for key in WEIGHT_KEYS:
        how = _source_text(trace, key, f"default: identity ({d}×{d})")
        out.append(f"  {key + ':':<21}{how}")
    if trace.scale_embeddings:
        scale_value = _number_text(trace.embedding_scale, decimals)
        scale = f"on (default): embeddings × √d_model = × {scale_value} (§3.4)"
    else:
        scale = "off (--no-scale)"
    pe = "on (default): sinusoidal (§3.5)" if trace.positional else "off (--no-positional)"
    mask = (
        "causal (--causal): token i sees tokens 0..i (§3.2.3)"
        if trace.causal
        else "none (default): every token sees every token"
    )
    out.append(f"  embedding scaling:   {scale}")
    out.append(f"  positional encoding: {pe}")
    out.append(f"  mask:                {mask}")
    out.append("")
    return out


def _input_lines(trace: AttentionTrace, decimals: int) -> list[str]:
    """Steps 1–3: the embeddings, scaled; the positional encodings; their sum X."""
    toks = trace.tokens
    out = ["Step 1. Token embeddings (§3.4)  (T×D)"]
    out += _matrix_block(trace.embeddings, toks, None, decimals)
    if trace.scale_embeddings:
        scale = _number_text(trace.embedding_scale, decimals)
        out.append(f"Step 1b. Embeddings × √d_model = × {scale} (§3.4)  (T×D)")
        out += _matrix_block(trace.scaled_embeddings, toks, None, decimals)
    if trace.positional:
        out.append("Step 2. Positional encodings (§3.5), pos = 0..T-1  (T×D)")
        out.append("  PE(pos, 2i) = sin(pos / 10000^(2i/d_model))")
        out.append("  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))")
        out += _matrix_block(trace.positional_encoding, toks, None, decimals)
    else:
        out.append("Step 2. Positional encodings (§3.5): skipped (--no-positional)")
        out.append("")
    out.append("Step 3. Attention input X = embeddings + PE (§3.5)  (T×D)")
    out += _matrix_block(trace.x, toks, None, decimals)
    return out


def _projection_lines(trace: AttentionTrace, decimals: int) -> list[str]:
    """Step 4's heading: W_Q, W_K, W_V (named when identities) and how heads split them."""
    d, d_k = trace.d_model, trace.d_k
    out = [
        f"Step 4. Attention per head (§3.2.2): head i uses columns (i-1)·d_k:i·d_k of "
        f"W_Q, W_K, W_V (d_k = {d_k})"
    ]
    for key in ("W_Q", "W_K", "W_V"):
        w = getattr(trace, key)
        if _is_identity(w):
            out.append(f"  {key} = identity ({d}×{d})")
        else:
            out.append(f"  {key}  (D×D)")
            out += _matrix_block(w, [str(i) for i in range(d)], None, decimals)
    out.append("")
    return out


def _head_lines(trace: AttentionTrace, i: int, decimals: int) -> list[str]:
    """Step 4.(i+1): head i's Q, K, V, scores, scaled scores, mask, weights and output."""
    toks, d_k, n = trace.tokens, trace.d_k, i + 1
    cols = f"{i * d_k}:{(i + 1) * d_k}"
    out = [f"Step 4.{n}. Head {n} of {trace.num_heads}: columns {cols}"]
    out.append(f"  Q_{n} = X W_Q[:, {cols}]  (T×d_k)")
    out += _matrix_block(trace.q[i], toks, None, decimals)
    out.append(f"  K_{n} = X W_K[:, {cols}]  (T×d_k)")
    out += _matrix_block(trace.k[i], toks, None, decimals)
    out.append(f"  V_{n} = X W_V[:, {cols}]  (T×d_v)")
    out += _matrix_block(trace.v[i], toks, None, decimals)
    out.append(f"  Scores Q_{n} K_{n}ᵀ (§3.2.1)  (T×T; rows = queries, columns = keys)")
    out += _matrix_block(trace.scores[i], toks, toks, decimals)
    out.append(
        f"  Scaled scores Q_{n} K_{n}ᵀ / √d_k, √d_k = √{d_k} = "
        f"{_number_text(trace.sqrt_d_k, decimals)} (§3.2.1, eq. 1)  (T×T)"
    )
    out += _matrix_block(trace.scaled_scores[i], toks, toks, decimals)
    if trace.mask is not None:
        if i == 0:
            out.append("  Causal mask (§3.2.3): 1 = may attend, 0 = blocked  (T×T)")
            out += _matrix_block(trace.mask, toks, toks, decimals)
        out.append("  Masked scaled scores: blocked entries set to -inf (§3.2.3)  (T×T)")
        out += _matrix_block(trace.masked_scores[i], toks, toks, decimals)
    out.append(
        "  Attention weights = softmax of each row (eq. 1): exp(s_j) / Σ_j' exp(s_j')  (T×T)"
    )
    out.append(format_matrix(trace.weights[i], toks, toks, decimals=decimals))
    sums = "  ".join(_number_text(float(s), decimals) for s in trace.weights[i].sum(dim=-1))
    out.append(f"    row sums: {sums}")
    out.append("")
    out.append(f"  head_{n} = weights · V_{n} (eq. 1)  (T×d_v)")
    out += _matrix_block(trace.heads[i], toks, None, decimals)
    return out


def _output_lines(trace: AttentionTrace, decimals: int) -> list[str]:
    """Steps 5–6: the heads concatenated, then multiplied by W_O."""
    toks, d = trace.tokens, trace.d_model
    heads = ", ".join(f"head_{i + 1}" for i in range(trace.num_heads))
    out = [f"Step 5. Concat({heads}) (§3.2.2)  (T×D)"]
    out += _matrix_block(trace.concat, toks, None, decimals)
    if _is_identity(trace.W_O):
        out.append(f"Step 6. Output = Concat · W_O (§3.2.2), W_O = identity ({d}×{d})  (T×D)")
    else:
        out.append("Step 6. Output = Concat · W_O (§3.2.2)  (T×D)")
        out.append("  W_O  (D×D)")
        out += _matrix_block(trace.W_O, [str(i) for i in range(d)], None, decimals)
        out.append("  Output")
    out += _matrix_block(trace.output, toks, None, decimals)
    return out


def _check_lines(trace: AttentionTrace, check: TraceCheck) -> list[str]:
    """The comparison with the library: the PE table (if used), then output and weights."""
    out: list[str] = []
    if trace.positional:
        pe_ok = check.positional_max_abs_diff <= check.positional_tolerance
        out.append(
            f"check: PE {'equals' if pe_ok else 'DIFFERS FROM'} "
            "aiayn.layers.sinusoidal_encoding to float32 precision "
            f"(max |diff| = {check.positional_max_abs_diff:.1e})"
        )
    ok = check.max_abs_diff <= check.tolerance
    out.append(
        f"check: {'equals' if ok else 'DIFFERS FROM'} {check.module} output and weights "
        f"(max |diff| = {check.max_abs_diff:.1e})"
    )
    return out


def format_trace(
    trace: AttentionTrace, *, decimals: int = 4, check: TraceCheck | None = None
) -> str:
    """The trace as text: a header with the settings, then each step with its matrix.

    Args:
        trace: from :func:`build_trace`.
        decimals: digits after the decimal point.
        check: if given (from :func:`check_trace`), a last line states the comparison.

    Raises:
        UserError: ``decimals`` outside 0..12.
    """
    if not 0 <= decimals <= _MAX_DECIMALS:
        raise UserError(f"decimals must be between 0 and {_MAX_DECIMALS}, got {decimals}")
    out = _header_lines(trace, decimals) + _input_lines(trace, decimals)
    out += _projection_lines(trace, decimals)
    for i in range(trace.num_heads):
        out += _head_lines(trace, i, decimals)
    out += _output_lines(trace, decimals)
    if check is not None:
        out += _check_lines(trace, check)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"
