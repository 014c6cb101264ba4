"""Hugging Face GPT-2 checkpoints <-> aiayn's :class:`~aiayn.models.gpt2.GPT2`, exactly.

Hugging Face's ``GPT2LMHeadModel`` (transformers, ``models/gpt2/modeling_gpt2.py``) holds the
weights of OpenAI's release (Radford et al. 2019) under the names of the original TensorFlow
code. :data:`HF_TO_AIAYN` is the whole name map, one row per tensor, in the style of torchtune's
``convert_weights.py`` (a layer index written ``{}``). Its ``conv1d`` column is nanoGPT's
transpose list (``from_pretrained`` in nanoGPT's ``model.py``): Hugging Face's ``Conv1D`` stores
its weight as (in, out), ``nn.Linear`` as (out, in). The fused ``c_attn`` projection is
[W^Q W^K W^V] along its output, the row order of aiayn's ``in_proj``, so a transpose is all it
needs.

Every tensor of the checkpoint is used or known to be a causal-mask buffer (``attn.bias``,
``attn.masked_bias`` of old checkpoints): an unexpected, missing or mis-shaped tensor is a
:class:`~aiayn.errors.UserError` naming it. Options of Hugging Face's config that change the
computation in a way aiayn's GPT-2 does not are refused by name (:data:`UNSUPPORTED`).

Shape legend:
    V vocabulary   P positions (n_positions)   D d_model (n_embd)   F inner size (n_inner or 4D)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from aiayn.convert.checks import check_field_types, load_exactly
from aiayn.convert.hf_folder import (
    read_hf_config,
    read_hf_tokenizer,
    read_hf_weights,
    resolve_hf_source,
    write_hf_folder,
)
from aiayn.data.text_tokenizer import TextTokenizer
from aiayn.errors import UserError
from aiayn.models.gpt2 import GPT2, GPT2Config


class Rule(NamedTuple):
    """Where a tensor goes: its name on the other side and whether it is a transposed Conv1D."""

    name: str
    conv1d: bool = False


HF_TO_AIAYN: dict[str, Rule] = {
    # Hugging Face name (without "transformer.")  aiayn name                       HF shape
    "wte.weight": Rule("embedder.embedding.weight"),  # (V, D)
    "wpe.weight": Rule("embedder.positional.weight"),  # (P, D)
    "h.{}.ln_1.weight": Rule("layers.{}.attn_sublayer.norm.weight"),  # (D,)
    "h.{}.ln_1.bias": Rule("layers.{}.attn_sublayer.norm.bias"),  # (D,)
    "h.{}.attn.c_attn.weight": Rule("layers.{}.self_attn.in_proj.weight", True),  # (D, 3D)
    "h.{}.attn.c_attn.bias": Rule("layers.{}.self_attn.in_proj.bias"),  # (3D,)
    "h.{}.attn.c_proj.weight": Rule("layers.{}.self_attn.out_proj.weight", True),  # (D, D)
    "h.{}.attn.c_proj.bias": Rule("layers.{}.self_attn.out_proj.bias"),  # (D,)
    "h.{}.ln_2.weight": Rule("layers.{}.ff_sublayer.norm.weight"),  # (D,)
    "h.{}.ln_2.bias": Rule("layers.{}.ff_sublayer.norm.bias"),  # (D,)
    "h.{}.mlp.c_fc.weight": Rule("layers.{}.feed_forward.linear1.weight", True),  # (D, F)
    "h.{}.mlp.c_fc.bias": Rule("layers.{}.feed_forward.linear1.bias"),  # (F,)
    "h.{}.mlp.c_proj.weight": Rule("layers.{}.feed_forward.linear2.weight", True),  # (F, D)
    "h.{}.mlp.c_proj.bias": Rule("layers.{}.feed_forward.linear2.bias"),  # (D,)
    "ln_f.weight": Rule("final_norm.weight"),  # (D,)
    "ln_f.bias": Rule("final_norm.bias"),  # (D,)
    "lm_head.weight": Rule("output_proj.weight"),  # (V, D); absent when tied
}
"""Hugging Face GPT-2 tensor names -> aiayn's: the one place the two namings meet."""

AIAYN_TO_HF: dict[str, Rule] = {
    rule.name: Rule(hf, rule.conv1d) for hf, rule in HF_TO_AIAYN.items()
}

IGNORED: frozenset[str] = frozenset({"h.{}.attn.bias", "h.{}.attn.masked_bias"})
"""Buffers of old checkpoints that hold the causal mask, not weights."""

HF_PREFIX = "transformer."
"""GPT2LMHeadModel's prefix of the body's tensors (a GPT2Model folder has none)."""

TIED_HEAD = "output_proj.weight"

UNSUPPORTED: dict[str, object] = {
    "scale_attn_weights": False,  # scores not divided by √d_k
    "scale_attn_by_inverse_layer_idx": True,  # scores further divided by the layer number
    "reorder_and_upcast_attn": True,  # Stanford CRFM Mistral's fp32 score path
    "add_cross_attention": True,  # an encoder–decoder GPT-2
}
"""Hugging Face options, with the value aiayn cannot compute, refused by name."""

ACTIVATIONS: dict[str, str] = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}
"""Hugging Face ``activation_function`` -> aiayn's activation (the same function)."""

HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "activation_function": "gelu_new",
    "resid_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": True,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
    "pad_token_id": None,
}
"""transformers' ``GPT2Config`` defaults: what a config.json leaving a key out means."""


def gpt2_config_from_hf(hf_config: Mapping[str, Any]) -> GPT2Config:
    """aiayn's config of a Hugging Face GPT-2 ``config.json`` (a dict)."""
    check_field_types(hf_config, HF_DEFAULTS)
    _check_supported(hf_config)
    hf = {**HF_DEFAULTS, **{k: v for k, v in hf_config.items() if k in HF_DEFAULTS}}
    eos = _token_id(hf, "eos_token_id")
    pad = eos if hf["pad_token_id"] is None else _token_id(hf, "pad_token_id")
    return GPT2Config(
        vocab_size=hf["vocab_size"],
        max_len=hf["n_positions"],
        d_model=hf["n_embd"],
        num_heads=hf["n_head"],
        num_layers=hf["n_layer"],
        d_ff=hf["n_inner"],
        activation=ACTIVATIONS[hf["activation_function"]],
        dropout=float(hf["resid_pdrop"]),
        embedding_dropout=float(hf["embd_pdrop"]),
        attention_dropout=float(hf["attn_pdrop"]),
        layer_norm_eps=float(hf["layer_norm_epsilon"]),
        tie_output=bool(hf["tie_word_embeddings"]),
        bos_id=_token_id(hf, "bos_token_id"),
        eos_id=eos,
        pad_id=pad,
    )


def _check_supported(hf_config: Mapping[str, Any]) -> None:
    model_type = hf_config.get("model_type")
    if model_type != "gpt2":
        raise UserError(f"model_type {model_type!r} is not GPT-2 ('gpt2')")
    for option, refused in UNSUPPORTED.items():
        if option in hf_config and hf_config[option] == refused:
            raise UserError(f"{option}={refused} is not supported by aiayn's GPT-2")
    activation = hf_config.get("activation_function", HF_DEFAULTS["activation_function"])
    if activation not in ACTIVATIONS:
        raise UserError(
            f"activation_function {activation!r} is not supported (choose from "
            f"{', '.join(ACTIVATIONS)})"
        )


def _token_id(hf: Mapping[str, Any], key: str) -> int:
    value = hf[key]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < hf["vocab_size"]:
        raise UserError(f"{key}={value!r} is not an id of the vocabulary (size {hf['vocab_size']})")
    return value


def gpt2_config_to_hf(config: GPT2Config) -> dict[str, Any]:
    """The Hugging Face ``config.json`` (a dict) of aiayn's GPT-2 config."""
    activation = {"gelu_tanh": "gelu_new"}.get(config.activation, config.activation)
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.max_len,
        "n_embd": config.d_model,
        "n_layer": config.num_layers,
        "n_head": config.num_heads,
        "n_inner": config.d_ff,
        "activation_function": activation,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.embedding_dropout,
        "attn_pdrop": config.attention_dropout,
        "layer_norm_epsilon": config.layer_norm_eps,
        "tie_word_embeddings": config.tie_output,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
        "pad_token_id": None if config.pad_id == config.eos_id else config.pad_id,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
    }


def _rename(name: str, table: Mapping[str, Rule]) -> Rule | None:
    """``name``'s rule in ``table`` with its layer index filled in, or None."""
    match = re.search(r"\.(\d+)\.", name)
    if match is None:
        return table.get(name)
    rule = table.get(f"{name[: match.start()]}.{{}}.{name[match.end() :]}")
    return None if rule is None else Rule(rule.name.format(match.group(1)), rule.conv1d)


def _is_ignored(name: str) -> bool:
    return re.sub(r"\.\d+\.", ".{}.", name, count=1) in IGNORED


def gpt2_state_dict_from_hf(hf_tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Hugging Face GPT-2 tensors -> aiayn's names and layouts (mask buffers dropped).

    Raises:
        UserError: naming a tensor that is not part of a GPT-2 language model.
    """
    state: dict[str, Tensor] = {}
    for hf_name, tensor in hf_tensors.items():
        name = hf_name.removeprefix(HF_PREFIX)
        if _is_ignored(name):
            continue
        rule = _rename(name, HF_TO_AIAYN)
        if rule is None:
            raise UserError(f"unexpected tensor {hf_name!r}: not part of a GPT-2 language model")
        if rule.name in state:
            raise UserError(
                f"tensor {hf_name!r} is in the checkpoint twice (with and without {HF_PREFIX!r})"
            )
        state[rule.name] = tensor.t() if rule.conv1d else tensor
    return state


def gpt2_state_dict_to_hf(model: GPT2) -> dict[str, Tensor]:
    """aiayn's GPT-2 tensors -> Hugging Face ``GPT2LMHeadModel``'s names and layouts (a tied
    head is left out, as ``save_pretrained`` does)."""
    tensors: dict[str, Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name == TIED_HEAD and model.config.tie_output:
            continue
        rule = _rename(name, AIAYN_TO_HF)
        assert rule is not None, f"{name} has no Hugging Face name"
        hf_name = rule.name if rule.name == "lm_head.weight" else HF_PREFIX + rule.name
        tensors[hf_name] = tensor.t().contiguous() if rule.conv1d else tensor
    return tensors


def load_gpt2_state(model: GPT2, state: dict[str, Tensor]) -> None:
    """Load converted tensors into ``model``: every parameter from the checkpoint, nothing left
    over, shapes as the config says.

    Raises:
        UserError: naming (in Hugging Face's terms) a missing, extra or mis-shaped tensor.
    """
    load_exactly(
        model,
        _fold_tied_head(model, dict(state)),
        name=lambda key: repr(_hf_name(key)),
        shape=_hf_shape,
        extra_hint=f"the config (n_layer={model.config.num_layers}) has no place for it",
    )
    if model.config.tie_output:  # assigned one by one, the two names hold two Parameters: re-tie
        model.output_proj.weight = model.embedder.embedding.weight


def _fold_tied_head(model: GPT2, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """With a tied head, the head is the embedding: a stored ``lm_head.weight`` must equal it."""
    if not model.config.tie_output:
        return state
    embedding = state.get("embedder.embedding.weight")
    head = state.pop(TIED_HEAD, None)
    if head is not None and embedding is not None and not torch.equal(head, embedding):
        raise UserError("tie_word_embeddings is true but lm_head.weight differs from wte.weight")
    if embedding is not None:
        state[TIED_HEAD] = embedding
    return state


def _hf_name(name: str) -> str:
    rule = _rename(name, AIAYN_TO_HF)
    return name if rule is None else rule.name


def _hf_shape(name: str, shape: torch.Size) -> tuple[int, ...]:
    rule = _rename(name, AIAYN_TO_HF)
    return tuple(reversed(shape)) if rule is not None and rule.conv1d else tuple(shape)


def gpt2_from_hf_tensors(
    hf_config: Mapping[str, Any], hf_tensors: Mapping[str, Tensor]
) -> tuple[GPT2, int]:
    """A GPT-2 (eval mode, fp32) from a config dict and its tensors; also the number of
    checkpoint tensors mapped."""
    with torch.device("meta"):  # no random draws or memory for weights the checkpoint gives
        model = GPT2(gpt2_config_from_hf(hf_config))
    state = {k: t.float().contiguous() for k, t in gpt2_state_dict_from_hf(hf_tensors).items()}
    load_gpt2_state(model, state)
    return model.eval(), len(state)


def gpt2_from_hf(path: str | Path) -> tuple[GPT2, TextTokenizer | None]:
    """A Hugging Face GPT-2 folder (or Hub name) as aiayn's GPT-2 and the folder's tokenizer."""
    folder = resolve_hf_source(path)
    model, _ = gpt2_from_hf_tensors(read_hf_config(folder), read_hf_weights(folder))
    return model, read_hf_tokenizer(folder)


def gpt2_to_hf(
    model: GPT2,
    out_dir: str | Path,
    tokenizer: TextTokenizer | Path | None = None,
    state: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face folder ``GPT2LMHeadModel.from_pretrained`` loads:
    ``config.json``, ``model.safetensors`` and, when given, the tokenizer (or its
    ``tokenizer.json``). ``state`` (the checkpoint's) holds nothing GPT-2 needs."""
    if isinstance(tokenizer, Path):
        tokenizer = TextTokenizer.load(tokenizer)
    tensors = gpt2_state_dict_to_hf(model)
    return write_hf_folder(Path(out_dir), gpt2_config_to_hf(model.config), tensors, tokenizer)
