"""Model configuration: a frozen dataclass with the paper's names and named presets.

Presets ``base`` and ``big`` are Table 3 of the paper (N, d_model, d_ff, h, d_k, d_v, P_drop,
ε_ls); ``small`` and ``tiny`` are for CPU work. Unknown keys and invalid values raise
:class:`~aiayn.errors.ConfigError` naming them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from aiayn.errors import ConfigError
from aiayn.validation import (
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Rate,
    validate,
    validated,
)

Activation = Literal["relu", "gelu", "silu"]
Positional = Literal["sinusoidal", "sinusoidal-halves", "learned", "none"]


_C = TypeVar("_C", bound="ModelConfig")


def check_heads(d_model: int, num_heads: int) -> None:
    """Refuse a ``d_model`` that the heads do not split evenly (d_k = d_model / num_heads)."""
    if d_model % num_heads:
        raise ConfigError(f"d_model={d_model} must be divisible by num_heads={num_heads}")


def check_labels(id2label: tuple[str, ...], num_labels: int) -> None:
    """Refuse label names (when given) that are not one per label."""
    if id2label and len(id2label) != num_labels:
        raise ConfigError(f"id2label names {len(id2label)} labels, but num_labels={num_labels}")


class ModelConfig:
    """What every family's frozen config dataclass shares: a validated copy with changes, and a
    round trip through plain dicts in which unknown keys are errors naming them."""

    d_model: int  # every family has a model width D (the schedule of eq. 3 reads it)

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model's learned position table covers, or None where
        positions go on (sinusoids, relative positions, none; a ViT's interpolated grid)."""
        return None

    def replace(self: _C, **changes: Any) -> _C:
        """A copy with some fields changed (validated; unknown keys rejected)."""
        return type(self).from_dict({**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """The settable fields as a plain dict (JSON/YAML friendly)."""
        assert dataclasses.is_dataclass(self)
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}

    def with_vocab_size(self: _C, vocab_size: int) -> _C:
        """A copy for a vocabulary of ``vocab_size`` tokens (a family without one refuses)."""
        return self.replace(vocab_size=vocab_size)

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


@validated("model")
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

    vocab_size: PositiveInt = 37000
    tgt_vocab_size: PositiveInt | None = None
    d_model: PositiveInt = 512
    d_ff: PositiveInt = 2048
    num_heads: PositiveInt = 8
    num_encoder_layers: NonNegativeInt = 6
    num_decoder_layers: NonNegativeInt = 6
    dropout: Rate = 0.1
    attention_dropout: Rate = 0.0
    activation: Activation = "relu"
    norm_first: bool = False
    positional: Positional = "sinusoidal"
    max_len: PositiveInt = 1024
    share_embeddings: bool = True
    tie_output: bool = True
    output_bias: bool = False
    layer_norm_eps: PositiveFloat = 1e-5
    pad_id: NonNegativeInt = 0

    def __post_init__(self) -> None:
        validate(self)
        check_heads(self.d_model, self.num_heads)
        if self.share_embeddings and self.target_vocab_size != self.vocab_size:
            raise ConfigError(
                "share_embeddings=True needs one joint vocabulary, but vocab_size="
                f"{self.vocab_size} and tgt_vocab_size={self.tgt_vocab_size}"
            )
        if self.pad_id >= min(self.vocab_size, self.target_vocab_size):
            raise ConfigError(f"pad_id={self.pad_id} is outside the vocabulary")

    @property
    def max_positions(self) -> int | None:
        """``max_len`` with learned positions (a table of that many rows); None with sinusoids
        (§3.5, computed for any length) or none."""
        return self.max_len if self.positional == "learned" else None

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

    def summary(self) -> str:
        """The architecture in one line, Table 3's names."""
        return (
            f"N={self.num_encoder_layers}+{self.num_decoder_layers} d_model={self.d_model} "
            f"d_ff={self.d_ff} h={self.num_heads} d_k={self.d_k} vocab={self.vocab_size} "
            f"shared={self.share_embeddings} tied={self.tie_output}"
        )


@dataclass(frozen=True)
class Published:
    """A published parameter count of a preset.

    Attributes:
        count: the parameters of the published model.
        vocab_size: the vocabulary size the count holds for (0: no vocabulary, e.g. images).
        source: where it is published, in words ("paper (Table 3)").
    """

    count: int
    vocab_size: int
    source: str


class Presets(Mapping[str, _C], Generic[_C]):
    """A family's named configs (a read-only mapping), with their published parameter counts.

    ``presets.build(name, **overrides)`` is the preset with fields changed (validated); an
    unknown name is a :class:`ConfigError` naming it and the choices.
    """

    def __init__(
        self,
        title: str,
        configs: Mapping[str, _C],
        published: Mapping[str, Published] | None = None,
    ) -> None:
        self.title = title
        self._configs = dict(configs)
        self.published: dict[str, Published] = dict(published or {})
        unknown = sorted(set(self.published) - set(self._configs))
        assert not unknown, f"published counts of unknown presets: {unknown}"

    def __getitem__(self, name: str) -> _C:
        return self._configs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._configs)

    def __len__(self) -> int:
        return len(self._configs)

    def build(self, name: str, **overrides: Any) -> _C:
        """The preset ``name``, optionally with fields changed."""
        if name not in self._configs:
            what = f"{self.title} preset" if self.title else "preset"
            raise ConfigError(f"unknown {what} {name!r} (choose from {', '.join(self)})")
        config = self._configs[name]
        return config.replace(**overrides) if overrides else config


PRESETS: Presets[TransformerConfig] = Presets(
    "",
    {
        # Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=64, P_drop=0.1, ε_ls=0.1.
        "base": TransformerConfig(),
        # Table 3, "big": N=6, d_model=1024, d_ff=4096, h=16, d_k=d_v=64, P_drop=0.3, ε_ls=0.1.
        "big": TransformerConfig(d_model=1024, d_ff=4096, num_heads=16, dropout=0.3),
        # CPU-sized: the width of the Multi30k reference peer (d_model 256, 4 heads, d_ff 1024).
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
    },
    published={  # Table 3 of the paper, with its 37k BPE vocabulary
        "base": Published(65_000_000, 37000, "paper (Table 3)"),
        "big": Published(213_000_000, 37000, "paper (Table 3)"),
    },
)

preset = PRESETS.build
"""A named preset (``base``, ``big``, ``small``, ``tiny``), optionally with fields changed."""
