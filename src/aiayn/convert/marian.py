"""Hugging Face Marian (OPUS-MT) checkpoints -> aiayn's paper :class:`~aiayn.models.Transformer`,
exactly.

Marian (Junczys-Dowmunt et al. 2018; the OPUS-MT models of Tiedemann & Thottingal 2020) is the
paper's encoder–decoder: post-norm layers, sinusoidal positions, embeddings × √d_model, a tied
output layer. Hugging Face's ``MarianMTModel`` (transformers, ``models/marian/modeling_marian.py``)
differs from §3 in parts that are options of aiayn's model, which :func:`marian_config_from_hf`
sets:

- the sinusoids in halves, sines first then cosines (``positional="sinusoidal-halves"``);
- ``activation_function`` "swish" of the OPUS-MT models (``activation="silu"``);
- ``final_logits_bias`` (1, V) added to the logits (``output_bias=True``);
- separate source and target vocabularies (``share_encoder_decoder_embeddings=False``:
  ``share_embeddings=False``, ``tgt_vocab_size=decoder_vocab_size``);
- LayerNorm ε 1e-5 (``nn.LayerNorm``'s default: Marian's config has no key for it), biases on
  every projection, queries scaled by head_dim^-0.5 (= 1/√d_k of eq. 1).

:data:`HF_TO_AIAYN` is the whole name map, one row per tensor (a layer index written ``{}``;
each layer's attentions and feed-forward network written once, by :func:`_attention` and
:func:`_feed_forward`).
Hugging Face projects Q, K and V with three (D, D) layers; aiayn's ``in_proj`` stacks them as the
rows [W^Q; W^K; W^V] (``Rule.block`` 0, 1, 2). Tied copies may be left out (``save_pretrained``
keeps one tensor of each tie) or stored several times (then they must be equal). The sinusoid
tables ``embed_positions`` are not loaded: aiayn computes them, and a stored one must equal that
computation. A missing ``final_logits_bias`` is zero, as Hugging Face loads it. Any other
unexpected, missing or mis-shaped tensor is a :class:`~aiayn.errors.UserError` naming it, and
options aiayn's model would compute differently are refused by name (:data:`UNSUPPORTED`).

The special ids and generation settings of the checkpoint (decoder start = pad, EOS, banned ids,
beams) are not part of the model: :func:`marian_generation_defaults` reads them into a
:class:`Seq2SeqSpecials`.

Shape legend:
    V source vocabulary   V_t target vocabulary   D d_model   F d_ff   P max_position_embeddings
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from aiayn.config import Activation, TransformerConfig
from aiayn.convert.checks import check_field_types
from aiayn.convert.generation import Seq2SeqSpecials, generation_defaults, is_token_id
from aiayn.convert.residual_basis import OUTPUT_BIAS_KEY, from_halves, positional_from_hf
from aiayn.data.pretrained_tokenizer import (
    TOKENIZER_JSON,
    PretrainedTokenizer,
    pretrained_tokenizer_from_hf,
)
from aiayn.data.text_tokenizer import TextTokenizer
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.layers.embedding import sinusoidal_encoding
from aiayn.models.transformer import Transformer, build_positional


class Rule(NamedTuple):
    """Where a Hugging Face tensor goes in aiayn's model.

    Attributes:
        name: the aiayn tensor.
        block: which third of a stacked [W^Q; W^K; W^V] ``in_proj`` it is (0, 1, 2), or None
            for the whole tensor.
        flatten: the Hugging Face tensor is (1, N) where aiayn's is (N,).
    """

    name: str
    block: int | None = None
    flatten: bool = False


_WB = ("weight", "bias")


def _attention(hf: str, ours: str, sublayer: str) -> dict[str, Rule]:
    """One attention's rows: ``{hf}.q_proj``, ``k_proj``, ``v_proj`` (D, D) and their biases
    (D,) as the thirds of ``{ours}.in_proj``, ``out_proj`` (D, D) and (D,), and the LayerNorm
    after it, ``{hf}_layer_norm`` (D,), as the ``{sublayer}``'s norm."""
    rows = {
        f"{hf}.{x}_proj.{k}": Rule(f"{ours}.in_proj.{k}", part)
        for k in _WB
        for part, x in enumerate("qkv")
    }
    rows.update({f"{hf}.out_proj.{k}": Rule(f"{ours}.out_proj.{k}") for k in _WB})
    rows.update({f"{hf}_layer_norm.{k}": Rule(f"{sublayer}.norm.{k}") for k in _WB})
    return rows


def _feed_forward(hf: str, ours: str) -> dict[str, Rule]:
    """A layer's feed-forward rows (``hf`` and ``ours`` the layer's prefixes): ``fc1`` (F, D)
    and (F,), ``fc2`` (D, F) and (D,), and the LayerNorm after it, ``final_layer_norm`` (D,)."""
    rows = {
        f"{hf}{fc}.{k}": Rule(f"{ours}feed_forward.{linear}.{k}")
        for fc, linear in (("fc1", "linear1"), ("fc2", "linear2"))
        for k in _WB
    }
    rows.update({f"{hf}final_layer_norm.{k}": Rule(f"{ours}ff_sublayer.norm.{k}") for k in _WB})
    return rows


_ENC, _E = "model.encoder.layers.{}.", "encoder.layers.{}."  # Hugging Face's, aiayn's
_DEC, _D = "model.decoder.layers.{}.", "decoder.layers.{}."

HF_TO_AIAYN: dict[str, Rule] = {
    # Hugging Face name (MarianMTModel)              aiayn name                             HF shape
    "model.shared.weight": Rule("encoder.embedder.embedding.weight"),  # (V, D), when shared
    "model.encoder.embed_tokens.weight": Rule("encoder.embedder.embedding.weight"),  # (V, D)
    "model.decoder.embed_tokens.weight": Rule("decoder.embedder.embedding.weight"),  # (V_t, D)
    "lm_head.weight": Rule("output_proj.weight"),  # (V_t, D)
    "final_logits_bias": Rule("output_proj.bias", flatten=True),  # (1, V_t)
    # encoder layer: self-attention, feed-forward, each followed by its LayerNorm (post-norm)
    **_attention(_ENC + "self_attn", _E + "self_attn", _E + "attn_sublayer"),
    **_feed_forward(_ENC, _E),
    # decoder layer: masked self-attention, encoder–decoder attention, feed-forward
    **_attention(_DEC + "self_attn", _D + "self_attn", _D + "self_sublayer"),
    **_attention(_DEC + "encoder_attn", _D + "cross_attn", _D + "cross_sublayer"),
    **_feed_forward(_DEC, _D),
}
"""Hugging Face Marian tensor names -> aiayn's: the one place the two namings meet."""

SHARED = "model.shared.weight"
POSITION_TABLES: tuple[str, ...] = (
    "model.encoder.embed_positions.weight",  # (P, D), the fixed sinusoids: checked, not loaded
    "model.decoder.embed_positions.weight",
)
OPTIONAL: dict[str, float] = {"output_proj.bias": 0.0}
"""aiayn tensors a checkpoint may leave out, and their value then (Hugging Face's
``_keys_to_ignore_on_load_missing``: a missing ``final_logits_bias`` is zero)."""

UNSUPPORTED: dict[str, object] = {
    "scale_embedding": False,  # embeddings not multiplied by √d_model
    "is_encoder_decoder": False,  # a decoder-only Marian (MarianForCausalLM)
    # keys of old (BART-era) configs, for computations neither aiayn nor transformers 5 does
    "normalize_before": True,  # pre-norm layers
    "normalize_embedding": True,  # a LayerNorm on the embeddings
    "add_final_layer_norm": True,  # a LayerNorm after each stack
    "static_position_embeddings": False,  # learned positions
    "add_bias_logits": True,  # a second logits bias
}
"""Hugging Face options, with the value aiayn cannot compute, refused by name."""

ZERO_ONLY: tuple[str, ...] = ("activation_dropout", "encoder_layerdrop", "decoder_layerdrop")
"""Training-time options aiayn's model has no part for: refused unless 0."""

ACTIVATIONS: dict[str, Activation] = {
    "swish": "silu",
    "silu": "silu",
    "relu": "relu",
    "gelu": "gelu",
}
"""Hugging Face ``activation_function`` -> aiayn's activation (the same function). "gelu_new"
(tanh GELU) is refused: aiayn's encoder–decoder has no such activation option."""

HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 58101,
    "decoder_vocab_size": None,
    "max_position_embeddings": 1024,
    "encoder_layers": 12,
    "encoder_ffn_dim": 4096,
    "encoder_attention_heads": 16,
    "decoder_layers": 12,
    "decoder_ffn_dim": 4096,
    "decoder_attention_heads": 16,
    "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0,
    "activation_function": "gelu",
    "d_model": 1024,
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "decoder_start_token_id": 58100,
    "scale_embedding": False,
    "pad_token_id": 58100,
    "eos_token_id": 0,
    "forced_eos_token_id": 0,
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
}
"""transformers' ``MarianConfig`` defaults: what a config.json leaving a key out means."""


def _hf(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    # forced_eos_token_id may be null (nothing forced): generation_defaults checks it
    check_field_types(hf_config, HF_DEFAULTS, skip=("forced_eos_token_id",))
    return {**HF_DEFAULTS, **{k: v for k, v in hf_config.items() if k in HF_DEFAULTS}}


def marian_config_from_hf(hf_config: Mapping[str, Any]) -> TransformerConfig:
    """aiayn's config of a Hugging Face Marian ``config.json`` (a dict).

    Raises:
        UserError: naming an option aiayn's model would compute differently.
    """
    _check_supported(hf_config)
    hf = _hf(hf_config)
    vocab, target_vocab = _vocab_sizes(hf)
    share = bool(hf["share_encoder_decoder_embeddings"])
    tie = bool(hf["tie_word_embeddings"])
    pad = hf["pad_token_id"]
    if not is_token_id(pad, min(vocab, target_vocab)):
        raise UserError(
            f"pad_token_id={pad!r} is not an id of both vocabularies (sizes {vocab} and "
            f"{target_vocab}): aiayn's model masks that id on both sides"
        )
    return TransformerConfig(
        vocab_size=vocab,
        tgt_vocab_size=None if target_vocab == vocab else target_vocab,
        d_model=hf["d_model"],
        d_ff=hf["encoder_ffn_dim"],
        num_heads=hf["encoder_attention_heads"],
        num_encoder_layers=hf["encoder_layers"],
        num_decoder_layers=hf["decoder_layers"],
        dropout=float(hf["dropout"]),
        attention_dropout=float(hf["attention_dropout"]),
        activation=ACTIVATIONS[hf["activation_function"]],
        norm_first=False,
        positional="sinusoidal-halves",
        max_len=hf["max_position_embeddings"],
        # transformers 5 ties the stacks' embeddings (and the head) only with tie_word_embeddings
        share_embeddings=share and tie,
        tie_output=tie,
        output_bias=True,
        layer_norm_eps=1e-5,
        pad_id=pad,
    )


def _check_supported(hf_config: Mapping[str, Any]) -> None:
    model_type = hf_config.get("model_type")
    if model_type != "marian":
        raise UserError(f"model_type {model_type!r} is not Marian ('marian')")
    hf = _hf(hf_config)
    for option, refused in UNSUPPORTED.items():
        if hf_config.get(option, HF_DEFAULTS.get(option)) == refused:  # absent: MarianConfig's
            raise UserError(f"{option}={refused} is not supported by aiayn's Transformer")
    for option in ZERO_ONLY:
        if hf[option] != 0:
            raise UserError(
                f"{option}={hf[option]} is not supported: aiayn's Transformer has none (only 0)"
            )
    activation = hf["activation_function"]
    if activation not in ACTIVATIONS:
        raise UserError(
            f"activation_function {activation!r} is not supported (choose from "
            f"{', '.join(ACTIVATIONS)})"
        )
    for encoder_key, decoder_key in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf[encoder_key] != hf[decoder_key]:
            raise UserError(
                f"{decoder_key}={hf[decoder_key]} differs from {encoder_key}="
                f"{hf[encoder_key]}: aiayn's Transformer has one value for both stacks"
            )


def _vocab_sizes(hf: Mapping[str, Any]) -> tuple[int, int]:
    """(source, target) vocabulary sizes, as ``MarianMTModel`` sizes its embeddings and head."""
    vocab, decoder_vocab = hf["vocab_size"], hf["decoder_vocab_size"]
    target = decoder_vocab or vocab
    if hf["share_encoder_decoder_embeddings"] and target != vocab:
        raise UserError(
            f"share_encoder_decoder_embeddings is true but decoder_vocab_size={decoder_vocab} "
            f"differs from vocab_size={vocab}"
        )
    return vocab, target


def _expected(config: TransformerConfig, shared: bool) -> dict[str, Rule]:
    """Every Hugging Face tensor name this config has a place for, with its rule (layer indices
    filled in, tied aiayn names resolved to the one tensor they are)."""
    rules: dict[str, Rule] = {}
    for hf_name, rule in HF_TO_AIAYN.items():
        if hf_name == SHARED and not (shared and config.share_embeddings):
            continue  # no model.shared, or (untied) one the stacks do not read: see _fold_shared
        if "{}" not in hf_name:
            rules[hf_name] = rule._replace(name=_tied_name(rule.name, config))
            continue
        stack = config.num_encoder_layers if hf_name.startswith("model.encoder.") else None
        layers = config.num_decoder_layers if stack is None else stack
        for i in range(layers):
            rules[hf_name.format(i)] = rule._replace(name=rule.name.format(i))
    return rules


def _tied_name(name: str, config: TransformerConfig) -> str:
    """The aiayn tensor that ``name`` is (shared embeddings, tied output layer)."""
    if name == "output_proj.weight" and config.tie_output:
        name = "decoder.embedder.embedding.weight"
    if name == "decoder.embedder.embedding.weight" and config.share_embeddings:
        name = "encoder.embedder.embedding.weight"
    return name


def _fold_shared(
    tensors: dict[str, Tensor], config: TransformerConfig, shared: bool
) -> dict[str, Tensor]:
    """``model.shared.weight`` where the stacks do not tie to it (share_encoder_decoder_embeddings
    with tie_word_embeddings false): transformers 5 reads each stack's own ``embed_tokens``, and
    ignores it; older checkpoints may hold it alone, read by both stacks."""
    if not shared or config.share_embeddings or SHARED not in tensors:
        return tensors
    tensors = dict(tensors)
    table = tensors.pop(SHARED)
    for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        tensors.setdefault(name, table)
    return tensors


def _check_position_table(name: str, tensor: Tensor, config: TransformerConfig) -> None:
    """A stored ``embed_positions`` table must be Marian's sinusoids, which aiayn computes."""
    want = sinusoidal_encoding(config.max_len, config.d_model, layout="halves")  # (P, D)
    if tensor.shape != want.shape:
        raise UserError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}; the config says {tuple(want.shape)}"
        )
    tolerance = 2 * max(1e-6, torch.finfo(tensor.dtype).eps) if tensor.is_floating_point() else 0
    if not torch.allclose(tensor.float(), want, rtol=0.0, atol=tolerance):
        raise UserError(
            f"tensor {name!r} is not Marian's sinusoid table (sines, then cosines): aiayn "
            "computes that table and cannot load another"
        )


def marian_state_dict_from_hf(
    hf_config: Mapping[str, Any], hf_tensors: Mapping[str, Tensor]
) -> tuple[dict[str, Tensor], int]:
    """Hugging Face Marian tensors -> aiayn's names and layouts (fp32), and the number of
    checkpoint tensors that went into them (tied copies included; the sinusoid tables, checked
    and not loaded, and an ignored ``model.shared.weight`` not).

    The returned state has one entry per distinct aiayn tensor: the encoder's embedding stands
    for the decoder's when they are shared, the decoder's for ``output_proj.weight`` when tied.

    Raises:
        UserError: naming (in Hugging Face's terms) an unexpected, missing or mis-shaped tensor,
            or tied copies that differ.
    """
    config = marian_config_from_hf(hf_config)
    shared = bool(_hf(hf_config)["share_encoder_decoder_embeddings"])
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in Transformer(config).state_dict().items()}
    rules = _expected(config, shared)
    blocks: dict[tuple[str, int | None], tuple[str, Tensor]] = {}  # (aiayn name, block) -> source
    mapped = 0
    for hf_name, tensor in sorted(_fold_shared(dict(hf_tensors), config, shared).items()):
        if hf_name in POSITION_TABLES:
            _check_position_table(hf_name, tensor, config)
            continue
        rule = rules.get(hf_name)
        if rule is None:
            raise UserError(
                f"unexpected tensor {hf_name!r}: not part of a Marian MT model with this config "
                f"(encoder_layers={config.num_encoder_layers}, decoder_layers="
                f"{config.num_decoder_layers}, share_encoder_decoder_embeddings={shared}, "
                f"tie_word_embeddings={config.tie_output})"
            )
        want = _hf_shape(rule, shapes[rule.name])
        if tuple(tensor.shape) != want:
            raise UserError(
                f"tensor {hf_name!r} has shape {tuple(tensor.shape)}; the config says {want}"
            )
        key = (rule.name, rule.block)
        if key in blocks:
            first, value = blocks[key]
            if not torch.equal(tensor, value):
                raise UserError(
                    f"tensor {hf_name!r} differs from {first!r}, though the config ties them "
                    f"(share_encoder_decoder_embeddings={shared}, "
                    f"tie_word_embeddings={config.tie_output})"
                )
        else:
            blocks[key] = (hf_name, tensor)
        mapped += 1
    state = _assemble(rules, blocks, shapes)
    return state, mapped


def _hf_shape(rule: Rule, aiayn_shape: torch.Size) -> tuple[int, ...]:
    """The Hugging Face shape of a tensor ``rule`` maps onto an aiayn tensor of this shape."""
    shape = tuple(aiayn_shape)
    if rule.block is not None:  # one of the three (I, D) blocks of the stacked (3I, D) rows
        shape = (shape[0] // 3, *shape[1:])
    return (1, *shape) if rule.flatten else shape


def _assemble(
    rules: Mapping[str, Rule],
    blocks: Mapping[tuple[str, int | None], tuple[str, Tensor]],
    shapes: Mapping[str, torch.Size],
) -> dict[str, Tensor]:
    """One fp32 tensor per aiayn name: stacked [Q; K; V] blocks, flattened rows; every expected
    tensor present (or optional)."""
    wanted: dict[str, dict[int | None, str]] = {}  # aiayn name -> block -> first HF name
    for hf_name, rule in rules.items():
        wanted.setdefault(rule.name, {}).setdefault(rule.block, hf_name)
    state: dict[str, Tensor] = {}
    for name, parts in wanted.items():
        missing = [hf for block, hf in parts.items() if (name, block) not in blocks]
        if missing and name in OPTIONAL and len(missing) == len(parts):
            state[name] = torch.full(tuple(shapes[name]), OPTIONAL[name])
            continue
        if missing:
            raise UserError(f"missing tensor {missing[0]!r} in the checkpoint")
        pieces = [blocks[(name, block)][1].float() for block in sorted(parts, key=_block_order)]
        tensor = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)  # [W^Q; W^K; W^V]
        state[name] = tensor.reshape(shapes[name]).contiguous()
    return state


def _block_order(block: int | None) -> int:
    return -1 if block is None else block


def load_marian_state(model: Transformer, state: Mapping[str, Tensor]) -> None:
    """Load converted tensors (:func:`marian_state_dict_from_hf`) into ``model`` and tie what the
    config ties; the sinusoid tables are (re)built, not loaded."""
    c = model.config
    full = dict(state)
    if c.share_embeddings:
        full["decoder.embedder.embedding.weight"] = full["encoder.embedder.embedding.weight"]
    if c.tie_output:
        full["output_proj.weight"] = full["decoder.embedder.embedding.weight"]
    model.load_state_dict(full, strict=True, assign=True)  # the converted tensors, in place
    # assigned one name at a time, tied names hold separate Parameters: tie them again
    if c.share_embeddings:
        model.decoder.embedder.embedding = model.encoder.embedder.embedding
    if c.tie_output:
        model.output_proj.weight = model.decoder.embedder.embedding.weight
    for stack in (model.encoder, model.decoder):  # buffers not in the state: computed here
        stack.embedder.positional = build_positional(c)


def marian_from_hf_tensors(
    hf_config: Mapping[str, Any], hf_tensors: Mapping[str, Tensor]
) -> tuple[Transformer, int]:
    """aiayn's Transformer (eval mode, fp32) from a Hugging Face Marian config dict and its
    tensors; also the number of checkpoint tensors mapped (see
    :func:`marian_state_dict_from_hf`).

    Raises:
        UserError: an unsupported option, or an unexpected, missing or mis-shaped tensor, named.
    """
    state, mapped = marian_state_dict_from_hf(hf_config, hf_tensors)
    return marian_model(marian_config_from_hf(hf_config), hf_config, state), mapped


def marian_model(
    config: TransformerConfig, hf_config: Mapping[str, Any], state: Mapping[str, Tensor]
) -> Transformer:
    """The Transformer (eval mode) of ``config`` holding ``state`` (aiayn's names), both put
    back in aiayn's layout where ``hf_config`` records it (:func:`aiayn_layout`)."""
    config, state = aiayn_layout(config, hf_config, state)
    with torch.device("meta"):  # no random draws or memory for weights the checkpoint gives
        model = Transformer(config)
    load_marian_state(model, state)
    return model.eval()


def aiayn_layout(
    config: TransformerConfig, hf_config: Mapping[str, Any], state: Mapping[str, Tensor]
) -> tuple[TransformerConfig, dict[str, Tensor]]:
    """The config and tensors of a folder that aiayn wrote from its own model, as that model
    was: the paper's interleaved sinusoids (the residual stream permuted back,
    :mod:`aiayn.convert.residual_basis`) and no output bias, when config.json records them;
    any other folder's unchanged.

    Raises:
        UserError: a folder recording no output bias whose ``final_logits_bias`` is not zero.
    """
    state = dict(state)
    if positional_from_hf(hf_config) == "sinusoidal":
        state = from_halves(state, config.d_model)
        config = config.replace(positional="sinusoidal")
    if hf_config.get(OUTPUT_BIAS_KEY) is False:
        if bool(state.pop("output_proj.bias").any()):
            raise UserError(
                f"final_logits_bias is not zero, yet config.json has {OUTPUT_BIAS_KEY}=false"
            )
        config = config.replace(output_bias=False)
    return config, state


# -- special ids and generation settings -----------------------------------------------------------


def marian_generation_defaults(
    hf_config: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None
) -> Seq2SeqSpecials:
    """The special ids and generation settings of a Marian checkpoint: each key from
    ``generation_config`` (``generation_config.json``) when it has it, else from ``config.json``,
    else ``MarianConfig``'s default (ids) or unset (settings); see
    :func:`~aiayn.convert.generation.generation_defaults`."""
    _, target_vocab = _vocab_sizes(_hf(hf_config))
    return generation_defaults(
        hf_config, generation_config, target_vocab=target_vocab, id_defaults=HF_DEFAULTS
    )


__all__ = [
    "HF_TO_AIAYN",
    "Rule",
    "Seq2SeqSpecials",
    "load_marian_state",
    "marian_config_from_hf",
    "marian_from_hf_tensors",
    "marian_generation_defaults",
    "marian_state_dict_from_hf",
]


def marian_tokenizer_from_hf(folder: Path) -> PretrainedTokenizer | TextTokenizer | None:
    """The tokenizer of a Hugging Face folder of this family: OPUS-MT's SentencePiece files, or
    the ``tokenizer.json`` of aiayn's joint BPE in a folder aiayn wrote (None when it has
    neither).

    Raises:
        UserError: a ``tokenizer.json`` without aiayn's fixed special ids, named.
    """
    tokenizer = pretrained_tokenizer_from_hf(folder, "marian")
    if tokenizer is None and (folder / TOKENIZER_JSON).is_file():
        Tokenizer.load(folder / TOKENIZER_JSON)  # aiayn's special ids, or refused by name
        return TextTokenizer.load(folder / TOKENIZER_JSON)
    return tokenizer
