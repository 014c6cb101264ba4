"""aiayn's encoder–decoder :class:`~aiayn.models.Transformer` -> a transformers folder, exactly.

Which transformers class computes the same function:

- **post-norm** (the paper's §3.1, and converted OPUS-MT models): ``MarianMTModel``. Marian is
  the paper's model with embeddings × √d_model (``scale_embedding``), fixed sinusoids in halves,
  a ``final_logits_bias`` (zero unless the model has an output bias), LayerNorm ε 1e-5.
- **pre-norm** (x + Sublayer(LayerNorm(x)), with a final LayerNorm after each stack):
  ``PegasusForConditionalGeneration`` (Zhang et al. 2020). Its layers are pre-norm, each stack
  ends with a LayerNorm, its embeddings are scaled by √d_model and its sinusoids are Marian's,
  counted from position 0; it has one vocabulary for both stacks. M2M100, the other pre-norm
  sinusoidal class, does not fit: it counts positions from ``padding_idx + 1`` (and keeps
  padding at its own position) and its frequencies are 10000^(−i/(h−1)) for h = D/2 rather than
  the paper's 10000^(−2i/D), so no weights give its table; MBart adds a LayerNorm on the
  embeddings.

The paper's interleaved sinusoids are Marian's halves up to a permutation of the model
dimension, applied to every tensor of the residual stream (:mod:`aiayn.convert.residual_basis`):
only the positional table is then Marian's. ``config.json`` records it
(``"aiayn_positional": "sinusoidal"``) so that converting the folder back undoes it, tensor for
tensor. Learned or no positions, a LayerNorm ε other than 1e-5 (neither class has a key for it)
and a pre-norm model with two vocabularies are refused by name.

The tokenizer goes with the model: aiayn's joint BPE as ``tokenizer.json`` with EOS appended to
every input (a template post-processor), as aiayn's decoding appends it; a converted OPUS-MT
model's own files. ``generation_config.json`` holds the special ids and decoding settings: a
converted model's recorded ones; for aiayn's own, the decoder starts at BOS, PAD and BOS are
banned, beam 4 and α 0.6 under transformers' rule (score / length^α: ``aiayn translate
--length-penalty hf``; the paper's GNMT penalty has no transformers equivalent).

Shape legend:  V vocabulary   V_t target vocabulary   D d_model   P max_position_embeddings
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors
from torch import Tensor

from aiayn.config import TransformerConfig
from aiayn.convert.hf_export import (
    HF_ACTIVATION_NAMES,
    copy_tokenizer_files,
    tensors_to_hf,
    write_generation_config,
    write_json,
)
from aiayn.convert.hf_folder import TOKENIZER_CONFIG, TOKENIZER_JSON, write_hf_folder
from aiayn.convert.marian import HF_TO_AIAYN
from aiayn.convert.residual_basis import OUTPUT_BIAS_KEY, POSITIONAL_KEY, to_halves
from aiayn.data.pretrained_tokenizer import MANIFEST, MarianTokenizer
from aiayn.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, Tokenizer
from aiayn.errors import UserError
from aiayn.layers.embedding import sinusoidal_encoding
from aiayn.models.transformer import Transformer

HF_ACTIVATION = {**HF_ACTIVATION_NAMES, "silu": "swish"}
"""aiayn's activation -> Marian's / Pegasus' ``activation_function``: the names every family's
export writes, but SiLU under the name Marian's configurations give it (``swish``, the same
function in Hugging Face's table)."""

LAYER_NORM_EPS = 1e-5
"""The LayerNorm ε of both classes (``nn.LayerNorm``'s default: their configs have no key)."""

FINAL_NORMS = {
    "model.encoder.layer_norm.weight": ("encoder.final_norm.weight", None),  # (D,)
    "model.encoder.layer_norm.bias": ("encoder.final_norm.bias", None),  # (D,)
    "model.decoder.layer_norm.weight": ("decoder.final_norm.weight", None),  # (D,)
    "model.decoder.layer_norm.bias": ("decoder.final_norm.bias", None),  # (D,)
}
"""Pegasus' stacks' final LayerNorms (pre-norm models)."""

POSITION_TABLES = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
"""The sinusoid tables Pegasus stores (Marian's save leaves them out): (P, D) each."""

LAYERS = {hf: (rule.name, rule.block) for hf, rule in HF_TO_AIAYN.items() if "{}" in hf}
"""The layers' name map (Marian's and Pegasus' layers are named alike), read backwards."""


def check_exportable(config: TransformerConfig) -> None:
    """Refuse, by name, what neither Marian nor Pegasus computes."""
    if config.positional not in ("sinusoidal", "sinusoidal-halves"):
        raise UserError(
            f"positional={config.positional!r} has no transformers encoder-decoder class "
            "(Marian and Pegasus add fixed sinusoids); use aiayn export --to ct2"
        )
    if config.layer_norm_eps != LAYER_NORM_EPS:
        raise UserError(
            f"layer_norm_eps={config.layer_norm_eps} is not supported: Marian and Pegasus use "
            f"{LAYER_NORM_EPS} (no config key changes it)"
        )
    if config.norm_first and not config.share_embeddings:
        raise UserError(
            "a pre-norm model with separate source and target embeddings has no transformers "
            "class (Pegasus, the pre-norm one, has one vocabulary); use aiayn export --to ct2"
        )


def transformer_state_to_hf(model: Transformer) -> dict[str, Tensor]:
    """The model's tensors under Marian's (post-norm) or Pegasus' (pre-norm) names, in Marian's
    basis (:mod:`aiayn.convert.residual_basis`), as their ``save_pretrained`` writes them."""
    c = model.config
    state = model.state_dict()
    if c.positional == "sinusoidal":
        state = to_halves(state, c.d_model)
    layers = {k: v for k, v in state.items() if ".layers." in k}
    tensors = tensors_to_hf(layers, LAYERS)
    if c.norm_first:
        tensors.update(tensors_to_hf({k: state[k] for k, _ in FINAL_NORMS.values()}, FINAL_NORMS))
        table = sinusoidal_encoding(c.max_len, c.d_model, layout="halves")  # (P, D)
        tensors.update({name: table.clone() for name in POSITION_TABLES})
    tensors.update(_embeddings(state, c))
    bias = state.get("output_proj.bias")
    logits_bias = torch.zeros(c.target_vocab_size) if bias is None else bias  # (V_t,)
    tensors["final_logits_bias"] = logits_bias.detach().clone()[None]  # (1, V_t)
    return tensors


def _embeddings(state: Mapping[str, Tensor], c: TransformerConfig) -> dict[str, Tensor]:
    """The embeddings and the output layer under the names transformers saves: one shared
    table when everything is tied, else each stack's own (and ``model.shared``, which it
    ignores then, when the stacks share a vocabulary) and the head."""
    source = state["encoder.embedder.embedding.weight"]  # (V, D)
    target = state["decoder.embedder.embedding.weight"]  # (V_t, D)
    tensors: dict[str, Tensor] = {}
    if c.norm_first or shares_a_table(c):
        tensors["model.shared.weight"] = source
    if not (c.share_embeddings and c.tie_output):
        tensors["model.encoder.embed_tokens.weight"] = source
        tensors["model.decoder.embed_tokens.weight"] = target
    if not c.tie_output:
        tensors["lm_head.weight"] = state["output_proj.weight"]  # (V_t, D)
    return {name: t.detach().clone() for name, t in tensors.items()}


def shares_a_table(config: TransformerConfig) -> bool:
    """Marian's ``share_encoder_decoder_embeddings`` for ``config``: one vocabulary, and the
    stacks tied to one table (shared embeddings) or, with an untied head, each stack's own
    (transformers 5 then ties nothing, and keeps an unused ``model.shared``, as it loads an
    untied OPUS-MT folder)."""
    c = config
    one_vocabulary = c.vocab_size == c.target_vocab_size
    return c.share_embeddings or (one_vocabulary and not c.tie_output)


def transformer_config_to_hf(
    config: TransformerConfig, specials: Mapping[str, Any]
) -> dict[str, Any]:
    """The ``config.json`` (a dict) of MarianMTModel (post-norm) or
    PegasusForConditionalGeneration (pre-norm) for ``config``, with the special ids given."""
    c = config
    hf: dict[str, Any] = {
        "architectures": ["PegasusForConditionalGeneration" if c.norm_first else "MarianMTModel"],
        "model_type": "pegasus" if c.norm_first else "marian",
        "vocab_size": c.vocab_size,
        "d_model": c.d_model,
        "encoder_layers": c.num_encoder_layers,
        "decoder_layers": c.num_decoder_layers,
        "encoder_attention_heads": c.num_heads,
        "decoder_attention_heads": c.num_heads,
        "encoder_ffn_dim": c.d_ff,
        "decoder_ffn_dim": c.d_ff,
        "activation_function": HF_ACTIVATION[c.activation],
        "dropout": c.dropout,
        "attention_dropout": c.attention_dropout,
        "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "max_position_embeddings": c.max_len,
        "scale_embedding": True,
        "tie_word_embeddings": c.tie_output,
        "is_encoder_decoder": True,
        "pad_token_id": c.pad_id,
        "eos_token_id": specials["eos_id"],
        "decoder_start_token_id": specials["decoder_start_id"],
    }
    # written even when unset: both classes' config defaults force a token (0, 1) otherwise
    hf["forced_eos_token_id"] = specials["eos_id"] if specials.get("forced_eos") else None
    if not c.norm_first:
        hf["decoder_vocab_size"] = c.target_vocab_size
        hf["share_encoder_decoder_embeddings"] = shares_a_table(c)
    if c.positional == "sinusoidal":
        hf[POSITIONAL_KEY] = "sinusoidal"
    if not c.output_bias:
        hf[OUTPUT_BIAS_KEY] = False
    return hf


def own_generation(config: TransformerConfig) -> dict[str, Any]:
    """The decoding settings of aiayn's own translation model (with its joint BPE's fixed
    special ids), as a :class:`~aiayn.convert.generation.Seq2SeqSpecials` dict."""
    return {
        "decoder_start_id": BOS_ID,
        "eos_id": EOS_ID,
        "pad_id": config.pad_id,
        "banned_ids": [PAD_ID, BOS_ID],
        "forced_eos": False,
        "num_beams": 4,
        "max_length": config.max_len,
        "length_penalty": 0.6,
        "early_stopping": True,
        "renormalize_logits": None,
    }


def transformer_to_hf(
    model: Transformer,
    out_dir: str | Path,
    tokenizer: Path | MarianTokenizer | None = None,
    state: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a transformers folder: ``config.json``, ``model.safetensors``,
    ``generation_config.json`` and the tokenizer (aiayn's joint BPE file, or a converted
    model's :class:`~aiayn.data.pretrained_tokenizer.MarianTokenizer`). ``state``: the
    checkpoint's ``state.json`` (a converted model's recorded decoding settings).

    Raises:
        UserError: a model neither class computes (:func:`check_exportable`).
    """
    config = model.config
    check_exportable(config)
    generation = (state or {}).get("generation") or own_generation(config)
    if config.pad_id != generation["pad_id"]:
        raise UserError(
            f"the model's pad_id={config.pad_id} differs from its tokenizer's "
            f"({generation['pad_id']}): transformers has one pad id"
        )
    hf_config = transformer_config_to_hf(config, generation)
    out = write_hf_folder(Path(out_dir), hf_config, transformer_state_to_hf(model))
    write_generation_config(out, generation)
    if isinstance(tokenizer, MarianTokenizer):
        _write_marian_tokenizer(tokenizer, out, config)
    elif tokenizer is not None:
        write_joint_bpe(tokenizer, out, config.max_len)
    return out


def write_joint_bpe(path: Path, out: Path, max_len: int) -> None:
    """aiayn's joint BPE (its ``tokenizer.json`` at ``path``) as ``tokenizer.json`` +
    ``tokenizer_config.json``: EOS appended to each input (as aiayn's decoding does),
    specials skipped when decoding, and text that spells a special token encoded as text
    (``split_special_tokens``), as aiayn encodes it."""
    Tokenizer.load(path)  # aiayn's fixed special ids, or a UserError naming the file
    hf = HFTokenizer.from_file(str(path))
    eos = SPECIAL_TOKENS[EOS_ID]
    hf.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A $B {eos}", special_tokens=[(eos, EOS_ID)]
    )
    (out / TOKENIZER_JSON).write_text(hf.to_str(pretty=False), encoding="utf-8")
    write_json(
        out,
        TOKENIZER_CONFIG,
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "pad_token": SPECIAL_TOKENS[PAD_ID],
            "bos_token": SPECIAL_TOKENS[BOS_ID],
            "eos_token": eos,
            "unk_token": SPECIAL_TOKENS[UNK_ID],
            "model_max_length": max_len,
            "split_special_tokens": True,
            "clean_up_tokenization_spaces": False,
        },
    )


def _write_marian_tokenizer(tokenizer: MarianTokenizer, out: Path, c: TransformerConfig) -> None:
    """A converted OPUS-MT model's files as its folder had them, and a tokenizer_config.json
    with its special tokens (what ``transformers.MarianTokenizer`` reads)."""
    manifest = copy_tokenizer_files(tokenizer, out, MANIFEST)
    tokens = {k: manifest[k] for k in ("pad_token", "eos_token", "unk_token")}
    write_json(
        out,
        TOKENIZER_CONFIG,
        {
            "tokenizer_class": "MarianTokenizer",
            **tokens,
            "separate_vocabs": bool(manifest.get("separate_vocabs")),
            "model_max_length": c.max_len,
            "clean_up_tokenization_spaces": bool(manifest["clean_up_tokenization_spaces"]),
        },
    )
