"""``aiayn export``: an aiayn model -> a folder another inference engine runs.

    ct2   CTranslate2 (:mod:`aiayn.convert.to_ct2`): encoder–decoders, decoder-only language
          models, encoders; float32, int8_float32 or int8 weights
    onnx  ONNX, for ONNX Runtime (:mod:`aiayn.convert.to_onnx`): encoder-only models

Each family names its exporters in the family registry (``Family.to_ct2``, ``Family.to_onnx``);
a family without one is refused by name, listing the families that have one. The engines are
optional extras, imported only here, on use: a missing one is a :class:`UserError` naming the
extra to install. A quantised model (int8 layers, :mod:`aiayn.layers.quantized`) or checkpoint
(``aiayn quantize``) is refused by name, a checkpoint before its weights are read: neither
converter reads int8 layers; the fp32 model exports, to CTranslate2 with its own int8
quantisation if wanted.

The output folder holds what the engine needs and the checkpoint's input processing (its
tokenizer files or image preprocessing, as in the checkpoint): CTranslate2 writes ``model.bin``,
``config.json`` and its vocabularies of token strings (``shared_vocabulary.json``, or
``source_vocabulary.json`` + ``target_vocabulary.json``, ``vocabulary.json`` for one-sided
models); an ONNX folder holds ``model.onnx``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from torch import nn

from aiayn.convert.formats import FORMATS
from aiayn.errors import UserError
from aiayn.models.families import FAMILIES, Family, family_of, resolve

_EXTRAS = {"ct2": ("ct2", ("ctranslate2",)), "onnx": ("onnx", ("onnx", "onnxscript"))}
"""Per format: the pip extra and the modules it installs that exporting needs."""


def require_extra(to: str) -> None:
    """A :class:`UserError` naming the extra to install, unless the modules exporting to ``to``
    needs are importable."""
    extra, modules = _EXTRAS[to]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(
            f"exporting to {FORMATS[to]} needs {', '.join(missing)}: pip install 'aiayn[{extra}]'"
        )


def exporter(family: Family, to: str) -> str:
    """The family's exporter reference for format ``to``; a family without one is a
    :class:`UserError` naming it and the families that have one."""
    ref: str | None = getattr(family, f"to_{to}")
    if ref is None:
        able = [f.name for f in FAMILIES.values() if getattr(f, f"to_{to}") is not None]
        raise UserError(
            f"a {family.name} model cannot be exported to {FORMATS[to]} "
            f"(families that can: {', '.join(able) or 'none'})"
        )
    return ref


def refuse_int8_checkpoint(folder: Path, quantization: str, source: object, to: str) -> None:
    """A :class:`UserError` for a quantised checkpoint (``quantization``, from its
    ``state.json``, not ``none``): neither format's converter reads int8 layers. It names
    ``folder``, the fp32 checkpoint to export instead (``source``: its ``quantized_from``, where
    a string) and how format ``to`` gets int8 weights, if it can."""
    if quantization == "none":
        return
    fp32 = "the fp32 checkpoint it was quantised from"
    if isinstance(source, str) and source:
        fp32 += f" ({source})"
    advice = (
        " with --to ct2 --quantization int8 (or int8_float32) for int8 weights in CTranslate2"
        if to == "ct2"
        else "; the ONNX export is fp32 only (--quantization is for --to ct2)"
    )
    raise UserError(
        f"{folder} holds an {quantization}-quantised model (aiayn quantize); aiayn export "
        f"reads fp32 checkpoints only: export {fp32}{advice}"
    )


def _refuse_int8_model(model: nn.Module, to: str) -> None:
    """A :class:`UserError` for a model holding int8 layers (:mod:`aiayn.layers.quantized`),
    which the exporters do not read."""
    from aiayn.layers.quantized import is_quantized

    if not is_quantized(model):
        return
    advice = (
        " with quantization='int8' (or 'int8_float32') for int8 weights in CTranslate2"
        if to == "ct2"
        else "; the ONNX export is fp32 only"
    )
    raise UserError(
        "the model holds int8 layers (aiayn quantize, --quantize int8), which export does not "
        f"read: export the fp32 model{advice}"
    )


def export_formats() -> str:
    """What exports where, in one sentence (``aiayn export --help``), from the registry."""
    parts = []
    for to, name in FORMATS.items():
        able = [f.title for f in FAMILIES.values() if getattr(f, f"to_{to}") is not None]
        parts.append(f"{name} (--to {to}): {', '.join(able) or 'none'}")
    return "; ".join(parts) + "."


def export_ct2(model: nn.Module, tokenizer: object, out: Path, quantization: str) -> Path:
    """Write ``model`` with the vocabulary of ``tokenizer`` (a checkpoint's
    :data:`~aiayn.checkpoint.TokenizerSource`) as the CTranslate2 folder ``out`` (absent)."""
    to = exporter(family_of(model), "ct2")
    _refuse_int8_model(model, "ct2")
    require_extra("ct2")
    from aiayn.checkpoint.tokenizers import write_tokenizer
    from aiayn.convert.to_ct2 import write_ct2

    written = write_ct2(resolve(to)(model, tokenizer), out, quantization)
    write_tokenizer(out, tokenizer)  # type: ignore[arg-type]
    return written


def export_onnx(model: nn.Module, tokenizer: object, out: Path) -> Path:
    """Write ``model`` as ``out/model.onnx`` (``out`` absent), with the checkpoint's tokenizer or
    image preprocessing ``tokenizer`` beside it."""
    to = exporter(family_of(model), "onnx")
    _refuse_int8_model(model, "onnx")
    require_extra("onnx")
    from aiayn.checkpoint.tokenizers import write_tokenizer
    from aiayn.convert.to_onnx import write_onnx

    path = write_onnx(resolve(to)(model), out)
    write_tokenizer(out, tokenizer)  # type: ignore[arg-type]
    return path


def left_behind(model: nn.Module, to: str) -> Sequence[str]:
    """The parts of ``model`` the ``to`` format leaves out (said by the command): a BERT's
    masked-LM or classification head in a CTranslate2 encoder."""
    if to != "ct2":
        return []
    return [name for name in ("mlm_head", "classifier") if getattr(model, name, None) is not None]
