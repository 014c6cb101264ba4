"""Model configuration: a frozen dataclass with the paper's names and named presets.

Presets ``base`` and ``big`` are Table 3 of the paper (N, d_model, d_ff, h, d_k, d_v, P_drop,
ε_ls); ``small`` and ``tiny`` are for CPU work. Unknown keys and invalid values raise
:class:`~aiayn.errors.ConfigError` naming them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from aiayn.errors import ConfigError

Activation = Literal["relu", "gelu", "silu"]
Positional = Literal["sinusoidal", "sinusoidal-halves", "learned", "none"]


_C = TypeVar("_C", bound="ModelConfig")


class ModelConfig:
    """What every family's frozen config dataclass shares: a validated copy with changes, and a
    round trip through plain dicts in which unknown keys are errors naming them."""

    def replace(self: _C, **changes: Any) -> _C:
        """A copy with some fields changed (validated; unknown keys rejected)."""
        return type(self).from_dict({**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """The settable fields as a plain dict (JSON/YAML friendly)."""
        assert dataclasses.is_dataclass(self)
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    @classmethod
    def from_dict(cls: type[_C], values: Mapping[str, Any]) -> _C:
        """Build from a mapping; unknown keys raise :class:`ConfigError` naming them."""
        assert dataclasses.is_dataclass(cls)
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown model config key(s): {', '.join(unknown)} "
                f"(valid keys: {', '.join(sorted(known))})"
            )
        return cls(**values)


@dataclass(frozen=True)
class TransformerConfig(ModelConfig):
    """Hyper-parameters of the encoder–decoder Transformer (§3, Table 3).

    Attributes:
        vocab_size: source vocabulary size (the joint vocabulary when shared; 37000 in §5.1).
        tgt_vocab_size: target vocabulary size; None = same as ``vocab_size``.
        d_model: model width D (§3.1).
        d_ff: inner size of the position-wise feed-forward network (§3.3).
        num_heads: h (§3.2.2); d_k = d_v = d_model / h.
        num_encoder_layers: N of the encoder stack.
        num_decoder_layers: N of the decoder stack.
        dropout: P_drop, on each sub-layer output and on embeddings + positions (§5.4).
        attention_dropout: dropout on attention weights (not in the paper; default 0).
        activation: of the feed-forward network: "relu" as in eq. 2, "gelu", or "silu"
            (x·σ(x), "swish": Marian's OPUS-MT models).
        norm_first: False = post-norm LayerNorm(x + Sublayer(x)) as in the paper;
            True = pre-norm x + Sublayer(LayerNorm(x)) with a final LayerNorm per stack.
        positional: "sinusoidal" (§3.5), "sinusoidal-halves" (the same sinusoids, sines in the
            first half of the dimensions and cosines in the second: Marian's layout),
            "learned" (Table 3 row E) or "none".
        max_len: longest sequence the positional encoding must cover.
        share_embeddings: one embedding matrix for source and target (§3.4; joint vocabulary).
        tie_output: the pre-softmax linear layer shares the target embedding's weights (§3.4).
        output_bias: the pre-softmax linear layer has a bias (zero at initialisation; Marian's
            ``final_logits_bias``); the paper's has none.
        layer_norm_eps: ε of LayerNorm.
        pad_id: id of the padding token (its embedding starts at zero and it is never attended
            to, except as the decoder's start token at position 0: Marian starts with it).
    """

    vocab_size: int = 37000
    tgt_vocab_size: int | None = None
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: Activation = "relu"
    norm_first: bool = False
    positional: Positional = "sinusoidal"
    max_len: int = 1024
    share_embeddings: bool = True
    tie_output: bool = True
    output_bias: bool = False
    layer_norm_eps: float = 1e-5
    pad_id: int = 0

    def __post_init__(self) -> None:
        check_field_types(self)
        positive = ("vocab_size", "d_model", "d_ff", "num_heads", "max_len")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("num_encoder_layers", "num_decoder_layers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.tgt_vocab_size is not None and self.tgt_vocab_size <= 0:
            raise ConfigError(f"tgt_vocab_size must be positive, got {self.tgt_vocab_size}")
        if self.d_model % self.num_heads != 0:
            raise ConfigError(
                f"d_model={self.d_model} must be divisible by num_heads={self.num_heads}"
            )
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value}")
        if self.activation not in typing.get_args(Activation):
            raise ConfigError(
                f"activation must be one of {typing.get_args(Activation)}, got {self.activation!r}"
            )
        if self.positional not in typing.get_args(Positional):
            raise ConfigError(
                f"positional must be one of {typing.get_args(Positional)}, got {self.positional!r}"
            )
        if self.share_embeddings and self.target_vocab_size != self.vocab_size:
            raise ConfigError(
                "share_embeddings=True needs one joint vocabulary, but vocab_size="
                f"{self.vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )
        if not 0 <= self.pad_id < min(self.vocab_size, self.target_vocab_size):
            raise ConfigError(f"pad_id={self.pad_id} is outside the vocabulary")
        if self.layer_norm_eps <= 0:
            raise ConfigError(f"layer_norm_eps must be positive, got {self.layer_norm_eps}")

    @property
    def d_k(self) -> int:
        """Query/key size per head, d_model / h (§3.2.2)."""
        return self.d_model // self.num_heads

    @property
    def d_v(self) -> int:
        """Value size per head, d_model / h (§3.2.2)."""
        return self.d_model // self.num_heads

    @property
    def target_vocab_size(self) -> int:
        """The target vocabulary size, resolving ``tgt_vocab_size=None``."""
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size


def check_field_types(config: Any) -> None:
    """Reject dataclass field values of the wrong type (a string for d_model, a bool for an int)."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        value = getattr(config, f.name)
        if not _is_instance(value, hints[f.name]):
            raise ConfigError(f"{f.name} has the wrong type: {value!r} (expected {hints[f.name]})")


def _is_instance(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is Literal:  # the allowed values are checked with a clearer message later
        return any(isinstance(value, type(arg)) for arg in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return any(_is_instance(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: any length of X
            return isinstance(value, tuple) and all(_is_instance(v, args[0]) for v in value)
        return isinstance(value, tuple) and all(
            _is_instance(v, a) for v, a in zip(value, args, strict=False)
        )
    return isinstance(value, hint)


PRESETS: dict[str, TransformerConfig] = {
    # Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=64, P_drop=0.1, ε_ls=0.1 (65M).
    "base": TransformerConfig(),
    # Table 3, "big": N=6, d_model=1024, d_ff=4096, h=16, d_k=d_v=64, P_drop=0.3, ε_ls=0.1 (213M).
    "big": TransformerConfig(d_model=1024, d_ff=4096, num_heads=16, dropout=0.3),
    # CPU-sized: the width of the Multi30k reference peer (d_model 256, 4 heads, d_ff 1024, 3+3).
    "small": TransformerConfig(
        vocab_size=8000,
        d_model=256,
        d_ff=1024,
        num_heads=4,
        num_encoder_layers=3,
        num_decoder_layers=3,
        max_len=512,
    ),
    # For tests and demonstrations in seconds.
    "tiny": TransformerConfig(
        vocab_size=1000,
        d_model=64,
        d_ff=256,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        max_len=256,
    ),
}


def preset(name: str, **overrides: Any) -> TransformerConfig:
    """A named preset (``base``, ``big``, ``small``, ``tiny``), optionally with fields changed."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    config = PRESETS[name]
    return config.replace(**overrides) if overrides else config


def validate_choice(name: str, value: object, choices: tuple[object, ...]) -> None:
    """Refuse ``value`` unless it is one of ``choices``, naming the field and the choices."""
    if value not in choices:
        raise ConfigError(f"{name} must be one of {choices}, got {value!r}")
