"""aiayn's :class:`~aiayn.models.t5.T5` -> a transformers ``T5ForConditionalGeneration`` folder,
exactly: the name map of :mod:`aiayn.convert.t5` read backwards (:func:`~aiayn.convert.hf_export.
tensors_to_hf`), the fused [W^Q; W^K; W^V] split into ``q``, ``k``, ``v``.

v1.0 (ReLU, the output layer tied to the shared embedding and the decoder states scaled by
d_model^−½ before it) and v1.1 (gated GELU, an output layer of its own, no scaling) are both
written: ``tie_word_embeddings`` and transformers 5's ``scale_decoder_outputs`` say which. The
feed-forward is ``feed_forward_proj``: ``"relu"``, ``"gated-gelu"`` (transformers reads it as
the tanh GELU), ``"gated-gelu_python"`` for the exact one. The tokenizer files of the converted
model go back as its folder had them (``spiece.model`` or ``tokenizer.json``) with a
``tokenizer_config.json``; the special ids and decoding settings as ``generation_config.json``.

Shape legend:  V vocabulary   D d_model   I = H·d_kv
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from aiayn.convert.hf_export import (
    HF_ACTIVATION_NAMES,
    copy_tokenizer_files,
    tensors_to_hf,
    write_generation_config,
    write_json,
)
from aiayn.convert.hf_folder import TOKENIZER_CONFIG, write_hf_folder
from aiayn.convert.t5 import HF_TO_AIAYN, T5_IDS
from aiayn.data.pretrained_tokenizer import MANIFEST, T5Tokenizer
from aiayn.models.t5 import T5, T5Config

SHARED = "encoder.embedder.embedding.weight"  # (V, D): one table for both stacks
COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
"""The stacks' names of the shared table, which transformers saves when the head is untied."""


def feed_forward_proj(config: T5Config) -> str:
    """transformers' ``feed_forward_proj`` of the config's feed-forward."""
    if config.gated and config.activation == "gelu_tanh":
        return "gated-gelu"  # transformers' T5Config maps it to gelu_new (tanh)
    name = HF_ACTIVATION_NAMES[config.activation]
    if config.gated:
        return "gated-" + ("gelu_python" if name == "gelu" else name)
    return name


def t5_config_to_hf(config: T5Config, specials: Mapping[str, Any]) -> dict[str, Any]:
    """The ``config.json`` (a dict) of T5ForConditionalGeneration for ``config``."""
    c = config
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "vocab_size": c.vocab_size,
        "d_model": c.d_model,
        "d_kv": c.d_kv,
        "d_ff": c.d_ff,
        "num_layers": c.num_encoder_layers,
        "num_decoder_layers": c.num_decoder_layers,
        "num_heads": c.num_heads,
        "relative_attention_num_buckets": c.num_buckets,
        "relative_attention_max_distance": c.max_distance,
        "dropout_rate": c.dropout,
        "layer_norm_epsilon": c.layer_norm_eps,
        "feed_forward_proj": feed_forward_proj(c),
        "tie_word_embeddings": c.tie_output,
        "scale_decoder_outputs": c.scale_output,
        "is_encoder_decoder": True,
        "pad_token_id": c.pad_id,
        "eos_token_id": specials["eos_id"],
        "decoder_start_token_id": specials["decoder_start_id"],
    }


def t5_state_to_hf(model: T5) -> dict[str, Tensor]:
    """The model's tensors under the names ``save_pretrained`` writes (the tied head left out,
    an untied head's stacks' copies of the shared table written)."""
    c = model.config
    state = dict(model.state_dict())
    del state["decoder.embedder.embedding.weight"]  # the shared table
    if c.tie_output:
        del state["output_proj.weight"]
    unused = ".wi." if c.gated else ".wi_"  # the other feed-forward's names
    skip = {hf for hf in HF_TO_AIAYN if unused in hf}
    tensors = tensors_to_hf(state, HF_TO_AIAYN, skip=skip)
    if not c.tie_output:
        tensors.update({name: tensors["shared.weight"].clone() for name in COPIES})
    return tensors


def t5_generation(state: Mapping[str, Any], config: T5Config) -> dict[str, Any]:
    """The checkpoint's recorded decoding settings, else T5's special ids."""
    recorded = state.get("generation")
    if recorded:
        return dict(recorded)
    return {
        "decoder_start_id": T5_IDS["decoder_start_token_id"],
        "eos_id": T5_IDS["eos_token_id"],
        "pad_id": config.pad_id,
    }


def t5_to_hf(
    model: T5,
    out_dir: str | Path,
    tokenizer: T5Tokenizer | None = None,
    state: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``model`` as a transformers folder: ``config.json``, ``model.safetensors``,
    ``generation_config.json`` and the converted model's tokenizer files."""
    generation = t5_generation(state or {}, model.config)
    hf_config = t5_config_to_hf(model.config, generation)
    out = write_hf_folder(Path(out_dir), hf_config, t5_state_to_hf(model))
    write_generation_config(out, generation)
    if isinstance(tokenizer, T5Tokenizer):
        write_t5_tokenizer(tokenizer, out)
    return out


def write_t5_tokenizer(tokenizer: T5Tokenizer, out: Path) -> None:
    """The tokenizer files as the converted folder had them, and a tokenizer_config.json with
    the special tokens and sentinels (what ``transformers.T5Tokenizer`` reads)."""
    manifest = copy_tokenizer_files(tokenizer, out, MANIFEST)
    tokens = {k: manifest[k] for k in ("pad_token", "eos_token", "unk_token")}
    config: dict[str, Any] = {"tokenizer_class": "T5Tokenizer", **tokens}
    if "extra_ids" in manifest and manifest["files"] != ["tokenizer.json"]:
        special: dict[str, int] = manifest.get("special_tokens", {})
        config["extra_ids"] = manifest["extra_ids"]
        extra = [t for t, _ in sorted(special.items(), key=lambda item: item[1])]
        config["additional_special_tokens"] = [t for t in extra if t not in tokens.values()]
    config["clean_up_tokenization_spaces"] = bool(manifest["clean_up_tokenization_spaces"])
    write_json(out, TOKENIZER_CONFIG, config)
