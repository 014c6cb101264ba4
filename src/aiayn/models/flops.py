"""Model FLOPs of the encoder–decoder Transformer: the numerator of "fraction of matmul peak".

Only matrix multiplications are counted (2 FLOPs per multiply–add); norms, softmax, dropout,
activations and the optimizer are not, so the figure is comparable with a matmul peak. Per
sentence pair with s source and t target tokens (padding excluded: it is not useful work),
D = d_model, F = d_ff, V = target vocabulary, N_e / N_d = encoder / decoder layers:

    encoder layer, per source token     2·(4·D² + 2·D·F)        W^Q, W^K, W^V, W^O, W_1, W_2
    encoder self-attention, per layer   2·2·s²·D                Q·Kᵀ and weights·V, all heads
    decoder layer, per target token     2·(6·D² + 2·D·F)        self W^{Q,K,V,O}, cross W^{Q,O}, FFN
    cross-attention K, V, per layer     2·2·D²·s                the memory's projections
    decoder attention, per layer        2·2·t²·D + 2·2·t·s·D    self (full t², as usually counted)
                                                                and encoder–decoder attention
    output projection                   2·D·V·t                 the pre-softmax linear layer

A training step costs 3× the forward (the backward computes two products per forward one:
gradients of the inputs and of the weights), the usual estimate; the embedding lookup and its
(scatter) gradient are not matmuls.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiayn.config import TransformerConfig


def forward_flops(config: TransformerConfig, src_len: int, tgt_len: int) -> int:
    """Matmul FLOPs of one teacher-forced forward pass over one (s, t) sentence pair."""
    d, f, v = config.d_model, config.d_ff, config.target_vocab_size
    s, t = src_len, tgt_len
    encoder = config.num_encoder_layers * (2 * (4 * d * d + 2 * d * f) * s + 4 * s * s * d)
    decoder = config.num_decoder_layers * (
        2 * (6 * d * d + 2 * d * f) * t  # projections and feed-forward of the target positions
        + 4 * d * d * s  # cross-attention keys and values of the memory
        + 4 * t * t * d  # masked self-attention
        + 4 * t * s * d  # encoder–decoder attention
    )
    output = 2 * d * v * t
    return encoder + decoder + output


def training_flops(
    config: TransformerConfig, src_lengths: Sequence[int], tgt_lengths: Sequence[int]
) -> int:
    """Matmul FLOPs of one training step (forward + backward = 3 × forward) over a batch.

    Args:
        config: the model's configuration.
        src_lengths: per sentence pair, the non-pad source tokens the model reads.
        tgt_lengths: per sentence pair, the non-pad target positions it predicts.
    """
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths")
    return 3 * sum(
        forward_flops(config, s, t) for s, t in zip(src_lengths, tgt_lengths, strict=True)
    )
