"""Hugging Face T5 checkpoints (``T5ForConditionalGeneration``) -> aiayn's
:class:`~aiayn.models.t5.T5`, exactly.

:data:`HF_TO_AIAYN` is the whole name map, one row per tensor (a layer index written ``{}``), in
the style of torchtune's ``convert_weights.py``. Hugging Face keeps W^Q, W^K and W^V of each
attention as three matrices ``q``, ``k``, ``v``; aiayn's attention holds them as the rows of one
``in_proj`` ([W^Q; W^K; W^V]), so the three are concatenated (the ``part`` column). The relative
position bias that Hugging Face stores in each stack's first layer is the stack's own part here.

Every tensor of the checkpoint is used or known to be redundant (the stacks' copies of the shared
embedding, which must equal it; the unused cross-attention bias of old checkpoints): an
unexpected, missing or mis-shaped tensor is a :class:`~aiayn.errors.UserError` naming it, and
so is an option aiayn's T5 does not compute.

Shape legend:  V vocabulary   D d_model   I = H·d_kv   F d_ff   H heads
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.convert.checks import (
    HF_ACTIVATIONS,
    Rule,
    check_field_types,
    fuse_parts,
    load_exactly,
    place_all,
)
from aiayn.convert.generation import Seq2SeqSpecials, generation_defaults
from aiayn.data.pretrained_tokenizer import PretrainedTokenizer, pretrained_tokenizer_from_hf
from aiayn.errors import UserError
from aiayn.layers import ACTIVATIONS
from aiayn.models.t5 import T5, T5Config


def _attention(hf: str, ours: str) -> dict[str, Rule]:
    return {
        f"{hf}.q.weight": Rule(f"{ours}.in_proj.weight", 0),  # (I, D)
        f"{hf}.k.weight": Rule(f"{ours}.in_proj.weight", 1),  # (I, D)
        f"{hf}.v.weight": Rule(f"{ours}.in_proj.weight", 2),  # (I, D)
        f"{hf}.o.weight": Rule(f"{ours}.out_proj.weight"),  # (D, I)
    }


def _feed_forward(hf: str, ours: str) -> dict[str, Rule]:
    return {
        f"{hf}.DenseReluDense.wi.weight": Rule(f"{ours}.feed_forward.linear1.weight"),  # (F, D)
        f"{hf}.DenseReluDense.wi_0.weight": Rule(f"{ours}.feed_forward.gate.weight"),  # (F, D)
        f"{hf}.DenseReluDense.wi_1.weight": Rule(f"{ours}.feed_forward.linear1.weight"),
        f"{hf}.DenseReluDense.wo.weight": Rule(f"{ours}.feed_forward.linear2.weight"),  # (D, F)
        f"{hf}.layer_norm.weight": Rule(f"{ours}.ff_sublayer.norm.weight"),  # (D,)
    }


HF_TO_AIAYN: dict[str, Rule] = {
    "shared.weight": Rule("encoder.embedder.embedding.weight"),  # (V, D), shared by all
    "lm_head.weight": Rule("output_proj.weight"),  # (V, D); the shared embedding when tied
    "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": Rule(
        "encoder.position_bias.embedding.weight"  # (buckets, H)
    ),
    "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": Rule(
        "decoder.position_bias.embedding.weight"  # (buckets, H)
    ),
    "encoder.final_layer_norm.weight": Rule("encoder.final_norm.weight"),  # (D,)
    "decoder.final_layer_norm.weight": Rule("decoder.final_norm.weight"),  # (D,)
    **_attention("encoder.block.{}.layer.0.SelfAttention", "encoder.layers.{}.self_attn"),
    "encoder.block.{}.layer.0.layer_norm.weight": Rule(
        "encoder.layers.{}.attn_sublayer.norm.weight"
    ),
    **_feed_forward("encoder.block.{}.layer.1", "encoder.layers.{}"),
    **_attention("decoder.block.{}.layer.0.SelfAttention", "decoder.layers.{}.self_attn"),
    "decoder.block.{}.layer.0.layer_norm.weight": Rule(
        "decoder.layers.{}.self_sublayer.norm.weight"
    ),
    **_attention("decoder.block.{}.layer.1.EncDecAttention", "decoder.layers.{}.cross_attn"),
    "decoder.block.{}.layer.1.layer_norm.weight": Rule(
        "decoder.layers.{}.cross_sublayer.norm.weight"
    ),
    **_feed_forward("decoder.block.{}.layer.2", "decoder.layers.{}"),
}
"""Hugging Face T5 tensor names -> aiayn's: the one place the two namings meet."""

COPIES_OF_SHARED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
"""The stacks' references to the shared embedding, stored by some folders: equal to it."""

IGNORED = frozenset({"decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"})
"""A cross-attention position bias older checkpoints carry and T5 never uses."""

HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32128,
    "d_model": 512,
    "d_kv": 64,
    "d_ff": 2048,
    "num_layers": 6,
    "num_decoder_layers": None,
    "num_heads": 8,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "dropout_rate": 0.1,
    "layer_norm_epsilon": 1e-6,
    "feed_forward_proj": "relu",
    "tie_word_embeddings": True,
    "pad_token_id": 0,
}
"""transformers' ``T5Config`` defaults: what a config.json leaving a key out means."""


def t5_config_from_hf(hf_config: Mapping[str, Any]) -> T5Config:
    """aiayn's config of a Hugging Face T5 ``config.json`` (a dict); options aiayn does not
    compute are refused by name."""
    check_field_types(hf_config, HF_DEFAULTS)
    if hf_config.get("model_type") != "t5":
        raise UserError(f"model_type {hf_config.get('model_type')!r} is not T5 ('t5')")
    hf = {**HF_DEFAULTS, **{k: v for k, v in hf_config.items() if k in HF_DEFAULTS}}
    gated, activation = _feed_forward_proj(str(hf["feed_forward_proj"]))
    tied = bool(hf["tie_word_embeddings"])
    # transformers 5 records the v1.0 output scaling apart from tying (and always ties)
    scaled = bool(hf_config.get("scale_decoder_outputs", tied))
    return T5Config(
        vocab_size=hf["vocab_size"],
        d_model=hf["d_model"],
        d_kv=hf["d_kv"],
        d_ff=hf["d_ff"],
        num_heads=hf["num_heads"],
        num_encoder_layers=hf["num_layers"],
        num_decoder_layers=hf["num_decoder_layers"] or hf["num_layers"],
        activation=activation,
        gated=gated,
        num_buckets=hf["relative_attention_num_buckets"],
        max_distance=hf["relative_attention_max_distance"],
        dropout=float(hf["dropout_rate"]),
        layer_norm_eps=float(hf["layer_norm_epsilon"]),
        tie_output=tied and scaled,  # checked against the tensors by t5_from_hf_tensors
        scale_output=scaled,
        pad_id=hf["pad_token_id"],
    )


def _feed_forward_proj(value: str) -> tuple[bool, str]:
    """``"gated-gelu"`` -> (True, "gelu_tanh") as transformers reads it; ``"relu"`` -> (False,
    "relu")."""
    gated, _, act = value.rpartition("-")
    if gated not in ("", "gated") or act not in HF_ACTIVATIONS:
        raise UserError(
            f"feed_forward_proj {value!r} is not supported (an activation of "
            f"{', '.join(HF_ACTIVATIONS)}, optionally 'gated-' before it)"
        )
    if value == "gated-gelu":  # transformers' T5Config maps it to the tanh approximation
        return True, "gelu_tanh"
    activation = HF_ACTIVATIONS[act]
    assert activation in ACTIVATIONS
    return gated == "gated", activation


def t5_state_dict_from_hf(hf_tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Hugging Face T5 tensors -> aiayn's names, q/k/v fused (redundant copies checked and
    dropped).

    Raises:
        UserError: naming a tensor that is not part of a T5 model, or a copy of the shared
            embedding that differs from it.
    """
    shared = hf_tensors.get("shared.weight")
    body: dict[str, Tensor] = {}
    for hf_name, tensor in hf_tensors.items():
        if hf_name in COPIES_OF_SHARED:
            if shared is not None and not torch.equal(tensor, shared):
                raise UserError(f"{hf_name} differs from shared.weight: untied input embeddings")
            if shared is None:
                shared = tensor
        elif hf_name not in IGNORED:
            body[hf_name] = tensor
    state, parts = place_all(body.items(), HF_TO_AIAYN, "a T5 model")
    if shared is not None:
        state["encoder.embedder.embedding.weight"] = shared
    state.update(fuse_parts(parts, ("q", "k", "v")))
    return state


def load_t5_state(model: T5, state: dict[str, Tensor]) -> None:
    """Load converted tensors into ``model``: every parameter from the checkpoint, nothing left
    over, shapes as the config says; the shared embedding (and a tied output layer) re-tied.

    Raises:
        UserError: naming a missing, extra or mis-shaped tensor (in aiayn's terms).
    """
    shared = "encoder.embedder.embedding.weight"
    if shared in state:
        state["decoder.embedder.embedding.weight"] = state[shared]
        if model.config.tie_output:
            head = state.get("output_proj.weight")
            if head is not None and not torch.equal(head, state[shared]):
                raise UserError("the config ties lm_head.weight to shared.weight, but they differ")
            state["output_proj.weight"] = state[shared]
    load_exactly(model, state, name=lambda key: f"for {key!r}")
    embedding = model.encoder.embedder.embedding
    model.decoder.embedder.embedding = embedding  # assigned one by one: re-tie
    if model.config.tie_output:
        model.output_proj.weight = embedding.weight


def t5_from_hf_tensors(
    hf_config: Mapping[str, Any], hf_tensors: Mapping[str, Tensor]
) -> tuple[T5, int]:
    """A T5 (eval mode, fp32) from a config dict and its tensors; also the number of checkpoint
    tensors mapped.

    Whether the output layer is tied follows the tensors as transformers reads them: an
    ``lm_head.weight`` that differs from ``shared.weight`` is an untied output layer (T5 v1.1).
    """
    config = t5_config_from_hf(hf_config)
    head, shared = hf_tensors.get("lm_head.weight"), hf_tensors.get("shared.weight")
    untied = head is not None and shared is not None and not torch.equal(head, shared)
    if untied and config.tie_output:
        config = config.replace(tie_output=False)
    if not untied and not config.tie_output and head is None:
        config = config.replace(tie_output=True)  # no head stored: the shared embedding
    with torch.device("meta"):  # no random draws or memory for weights the checkpoint gives
        model = T5(config)
    state = {k: t.float().contiguous() for k, t in t5_state_dict_from_hf(hf_tensors).items()}
    load_t5_state(model, state)
    return model.eval(), len(state)


T5_IDS: dict[str, int] = {"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}
"""T5's special ids where a folder does not give them: decoding starts from the pad token."""


def t5_generation_defaults(
    hf_config: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None
) -> Seq2SeqSpecials:
    """The special ids and generation settings of a T5 checkpoint (see
    :func:`~aiayn.convert.generation.generation_defaults`)."""
    vocab = hf_config.get("vocab_size", HF_DEFAULTS["vocab_size"])
    return generation_defaults(hf_config, generation_config, target_vocab=vocab, id_defaults=T5_IDS)


def t5_tokenizer_from_hf(folder: Path) -> PretrainedTokenizer | None:
    """The tokenizer of a Hugging Face folder of this family (None when it has none)."""
    return pretrained_tokenizer_from_hf(folder, "t5")
