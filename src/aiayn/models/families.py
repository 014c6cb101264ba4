"""The family registry: the one place that says what each model family is and can do.

A family is a config class with presets, a model class built from the config (its builder), the
Hugging Face ``model_type``\\ s it converts from and whether it converts back, the fast inference
runner, the commands it serves and the training tasks it learns, keyed by what the data section
asks for. Every other module asks here instead of testing a family's name or class: ``aiayn
train`` picks its task, ``aiayn convert`` its converter, ``aiayn params`` a preset's family and
the commands which checkpoints they accept.

This module sits in the models layer, yet names converters, runners and tasks of higher layers:
it names them as references (``"aiayn.training.lm:LanguageModelTask"``), imported only when
asked for (:func:`resolve`), as transformers' auto mappings do. Building a model never imports
``aiayn.training`` or ``aiayn.convert``.

To add a family: its config and model (``aiayn/models/<family>.py``), its converters
(``aiayn/convert/<family>.py``), its training task if it trains, and one :class:`Family` entry
in :data:`FAMILIES` below (docs/architecture.md lists the steps).

Checkpoints record their family's name in ``state.json`` (format versions and their upgrades:
:mod:`aiayn.checkpoint.upgrade`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from aiayn.config import PRESETS, ModelConfig, Presets, TransformerConfig
from aiayn.errors import UserError
from aiayn.models.bert import BERT, BERT_PRESETS, BertConfig, expected_bert_parameters
from aiayn.models.gpt2 import GPT2, GPT2_PRESETS, GPT2Config, expected_gpt2_parameters
from aiayn.models.params import expected_parameter_count
from aiayn.models.t5 import T5, T5_PRESETS, T5Config, expected_t5_parameters
from aiayn.models.transformer import Transformer
from aiayn.models.vit import VIT_PRESETS, ViT, ViTConfig, expected_vit_parameters

COMMANDS = (
    "translate",
    "generate",
    "embed",
    "fill-mask",
    "classify-text",
    "classify-image",
    "attention",
)
"""What a family's checkpoint may be used for, by command (and, later, service endpoint):
``translate`` (also ``aiayn evaluate --src``, BLEU), ``generate`` (also ``aiayn evaluate
--text``, perplexity), ``embed``, ``fill-mask``, ``classify-text``, ``classify-image`` and
``attention`` (its maps, step by step)."""


def resolve(ref: str) -> Any:
    """The object a reference ``"package.module:attribute"`` names, imported now."""
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class HFSource:
    """A Hugging Face ``model_type`` a family converts from (references, see :func:`resolve`).

    Attributes:
        convert: ``(config.json, tensors) -> (model, tensors mapped)``, exact or refusing.
        tokenizer: ``folder -> input processing or None``: the folder's tokenizer (or image
            preprocessing).
        generation: encoder–decoders: ``(config.json, generation_config.json or None) ->
            Seq2SeqSpecials``, the special ids and decoding defaults.
    """

    convert: str
    tokenizer: str
    generation: str | None = None


@dataclass(frozen=True)
class Training:
    """How ``aiayn train`` trains a family (references, see :func:`resolve`).

    Attributes:
        data: the data-section class (its ``task_name`` picks the task).
        tasks: the data section's ``task_name`` -> the task class
            (:class:`~aiayn.training.task.Task`), called with ``(run, log)``.
        label: what the family is trained for, in messages ("language model").
        init_from: whether a run may start from a checkpoint of the family (``model.init_from``).
        check: ``(run) -> None``: the family's own checks of a whole run config, or None.
        adapt: ``(model config, data section, model keys given) -> model config``: the model
            the data's task needs (a BERT's head), or None.
        demos: built-in runs (``aiayn train --demo NAME``) -> their run config (a dict).
    """

    data: str
    tasks: Mapping[str, str]
    label: str
    init_from: bool = False
    check: str | None = None
    adapt: str | None = None
    demos: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AttentionCapture:
    """How ``aiayn attention`` draws a family's attention (references, see :func:`resolve`).

    Attributes:
        collect: ``(checkpoint, AttentionRequest) -> result``: runs the model once on the input
            and keeps the weights its forward returns; the result has ``summary()`` (lines to
            print) and is written (the PNGs and ``attention.html``) by
            :func:`aiayn.visualization.capture.write_capture`.
        reads: the flag its input comes from: "src", "text" or "image".
        options: the further flags it takes: "tgt" (a target sentence), "continue" (greedy
            tokens appended to a prompt).
        files: glob patterns of the PNG files it writes (refused in ``--out`` without
            ``--force``).
        pages: the HTML files it writes (refused alike).
    """

    collect: str
    reads: str
    options: frozenset[str] = frozenset()
    files: tuple[str, ...] = ()
    pages: tuple[str, ...] = ("attention.html",)


@dataclass(frozen=True)
class QuantizePolicy:
    """What ``--quantize int8`` (:mod:`aiayn.layers.quantized`) leaves in fp32 for a family.

    Every ``nn.Linear`` is quantised (int8 weights, per-output-channel scales) except those
    named in ``keep``; embeddings, norms and convolutions are never quantised. A family keeps a
    layer in fp32 where int8 would cost accuracy for little speed (a classifier's few rows).

    Attributes:
        keep: qualified module names (``"pooler"``) kept in fp32, with everything under them.
    """

    keep: tuple[str, ...] = ()

    def keeps(self, name: str) -> bool:
        """Whether the linear layer called ``name`` stays in fp32."""
        return any(name == k or name.startswith(k + ".") for k in self.keep)


@dataclass(frozen=True, kw_only=True)
class Family:
    """A model family: everything about it that any command asks (every field by keyword).

    Attributes:
        name: its name in checkpoints and in ``model.family``.
        title: its name in prose ("GPT-2").
        config: its frozen config class.
        model: its model class; ``model(config)`` builds it from its parts.
        presets: its named configs, with published parameter counts.
        default_preset: the preset a training run starts from when it names none.
        count: the closed-form parameter count of a config (checked against the model).
        commands: the commands (:data:`COMMANDS`) its checkpoints serve.
        modules: the modules that are its own (a test holds its name to them and this one).
        reads: what its input is, "text" or "image".
        from_hf: Hugging Face ``model_type`` -> how to convert it.
        to_hf: ``(model, folder, tokenizer, state) -> folder``: writes it back as transformers
            loads it (``tokenizer``: the checkpoint's input processing,
            :func:`aiayn.checkpoint.tokenizers.checkpoint_tokenizer`, or None; ``state``: its
            ``state.json``), or None.
        to_ct2: ``(model, tokenizer source) -> spec builder``: its CTranslate2 exporter
            (:mod:`aiayn.convert.to_ct2`), or None.
        to_onnx: ``(model) -> graph``: its ONNX exporter (:mod:`aiayn.convert.to_onnx`), or None.
        inference: the fast inference runner (held equal to the model's forward; the
            encoder–decoders' decoding step, which runs their encoder through
            :mod:`aiayn.inference`), or None (GPT-2 decodes through its module with a KV cache).
        training: how it trains, or None.
        attention: how ``aiayn attention`` draws its attention, or None.
        first_layer: ``(model, checkpoint folder, text or image file) -> FirstLayerInputs``:
            its first self-attention layer's inputs for ``aiayn explain --checkpoint``
            (:mod:`aiayn.visualization.first_layer`), or None.
        position_bias: ``(model) -> {stack name: RelativePositionBias}``: its learned relative
            position biases (``aiayn attention --bias``), or None.
        quantize: which linear layers stay in fp32 under ``--quantize int8``.
    """

    name: str
    title: str
    config: type[ModelConfig]
    model: type[nn.Module]
    presets: Presets[Any]
    default_preset: str
    count: Callable[[Any], int]
    commands: frozenset[str]
    modules: tuple[str, ...]
    reads: str = "text"
    from_hf: Mapping[str, HFSource] = field(default_factory=dict)
    to_hf: str | None = None
    to_ct2: str | None = None
    to_onnx: str | None = None
    inference: str | None = None
    training: Training | None = None
    attention: AttentionCapture | None = None
    first_layer: str | None = None
    position_bias: str | None = None
    quantize: QuantizePolicy = QuantizePolicy()

    def build(self, config: ModelConfig) -> nn.Module:
        """A model of this family with fresh weights."""
        return self.model(config)

    def supports(self, command: str) -> bool:
        """Whether its checkpoints serve ``command``."""
        assert command in COMMANDS, command
        return command in self.commands

    def task_class(self, data: Any) -> Any:
        """The training task class for the data section ``data``."""
        assert self.training is not None, f"family {self.name} does not train"
        return resolve(self.training.tasks[data.task_name])


_TOKENIZERS = "aiayn.data.pretrained_tokenizer"
_MAPS = ("L*_H*.png", "all.png")
_TRANSLATION_ATTENTION = AttentionCapture(
    "aiayn.visualization.attention_maps:translation_attention",
    "src",
    frozenset({"tgt"}),
    tuple(f"{kind}_{m}" for kind in ("encoder_self", "decoder_self", "cross") for m in _MAPS),
)
_DECODER_STEP = "aiayn.decoding.fast_step:InferenceStep"  # the encoder runs on aiayn.inference
_TO_CT2_ENCODER_DECODER = "aiayn.convert.to_ct2:encoder_decoder_to_ct2"  # read from its parts
_FIRST_LAYER = "aiayn.visualization.first_layer:"

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            name="transformer",
            title="Transformer",
            config=TransformerConfig,
            model=Transformer,
            presets=PRESETS,
            default_preset="small",
            count=expected_parameter_count,
            commands=frozenset({"translate", "attention"}),
            modules=(
                "aiayn.config",
                "aiayn.models.transformer",
                "aiayn.convert.marian",
                "aiayn.convert.pegasus",
                "aiayn.convert.transformer_to_hf",
                "aiayn.training.translation",
                _TOKENIZERS,
            ),
            from_hf={
                "marian": HFSource(
                    "aiayn.convert.marian:marian_from_hf_tensors",
                    "aiayn.convert.marian:marian_tokenizer_from_hf",
                    "aiayn.convert.marian:marian_generation_defaults",
                ),
                "pegasus": HFSource(
                    "aiayn.convert.pegasus:pegasus_from_hf_tensors",
                    "aiayn.convert.pegasus:pegasus_tokenizer_from_hf",
                    "aiayn.convert.pegasus:pegasus_generation_defaults",
                ),
            },
            to_ct2=_TO_CT2_ENCODER_DECODER,
            to_hf="aiayn.convert.transformer_to_hf:transformer_to_hf",
            inference=_DECODER_STEP,
            attention=_TRANSLATION_ATTENTION,
            training=Training(
                "aiayn.training.config:DataConfig",
                {"translation": "aiayn.training.translation:TranslationTask"},
                "translation",
                init_from=True,
                check="aiayn.training.translation_start:check_translation_run",
                demos={"translation": "aiayn.training.translation:DEMO_CONFIG"},
            ),
            first_layer=_FIRST_LAYER + "encoder_decoder_first_layer",
        ),
        Family(
            name="gpt2",
            title="GPT-2",
            config=GPT2Config,
            model=GPT2,
            presets=GPT2_PRESETS,
            default_preset="gpt2-tiny",
            count=expected_gpt2_parameters,
            commands=frozenset({"generate", "attention"}),
            modules=("aiayn.models.gpt2", "aiayn.convert.gpt2", "aiayn.training.lm"),
            from_hf={
                "gpt2": HFSource(
                    "aiayn.convert.gpt2:gpt2_from_hf_tensors",
                    "aiayn.convert.hf_folder:read_hf_tokenizer",
                )
            },
            to_hf="aiayn.convert.gpt2:gpt2_to_hf",
            to_ct2="aiayn.convert.to_ct2:decoder_only_to_ct2",
            attention=AttentionCapture(
                "aiayn.visualization.lm_attention:lm_attention",
                "text",
                frozenset({"continue"}),
                tuple(f"self_{m}" for m in _MAPS),
            ),
            training=Training(
                "aiayn.training.config:LMDataConfig",
                {"language-model": "aiayn.training.lm:LanguageModelTask"},
                "language model",
                init_from=True,
                check="aiayn.training.lm:check_lm_run",
                demos={"lm": "aiayn.training.lm:LM_DEMO_CONFIG"},
            ),
            first_layer=_FIRST_LAYER + "decoder_only_first_layer",
        ),
        Family(
            name="t5",
            title="T5",
            config=T5Config,
            model=T5,
            presets=T5_PRESETS,
            default_preset="t5-tiny",
            count=expected_t5_parameters,
            commands=frozenset({"translate", "attention"}),
            modules=("aiayn.models.t5", "aiayn.convert.t5", "aiayn.convert.t5_to_hf", _TOKENIZERS),
            from_hf={
                "t5": HFSource(
                    "aiayn.convert.t5:t5_from_hf_tensors",
                    "aiayn.convert.t5:t5_tokenizer_from_hf",
                    "aiayn.convert.t5:t5_generation_defaults",
                )
            },
            to_ct2=_TO_CT2_ENCODER_DECODER,
            to_hf="aiayn.convert.t5_to_hf:t5_to_hf",
            inference=_DECODER_STEP,
            attention=_TRANSLATION_ATTENTION,
            training=Training(  # fine-tuning a converted T5 only (init_from required)
                "aiayn.training.config:DataConfig",
                {"translation": "aiayn.training.translation:TranslationTask"},
                "translation",
                init_from=True,
                check="aiayn.training.translation_start:check_fine_tuning_run",
            ),
            first_layer=_FIRST_LAYER + "encoder_decoder_first_layer",
            position_bias="aiayn.models.t5:t5_position_biases",
        ),
        Family(
            name="bert",
            title="BERT",
            config=BertConfig,
            model=BERT,
            presets=BERT_PRESETS,
            default_preset="bert-tiny",
            count=expected_bert_parameters,
            commands=frozenset({"embed", "fill-mask", "classify-text", "attention"}),
            modules=(
                "aiayn.models.bert",
                "aiayn.convert.bert",
                "aiayn.convert.bert_to_hf",
                "aiayn.training.bert_start",
                "aiayn.training.masked_lm",
                "aiayn.training.text_classification",
            ),
            from_hf={
                "bert": HFSource(
                    "aiayn.convert.bert:bert_from_hf_tensors",
                    "aiayn.data.bert_tokenizer:bert_tokenizer_from_hf",
                )
            },
            to_ct2="aiayn.convert.to_ct2:encoder_to_ct2",
            to_onnx="aiayn.convert.to_onnx:bert_to_onnx",
            to_hf="aiayn.convert.bert_to_hf:bert_to_hf",
            inference="aiayn.inference.encoder:BertInference",
            attention=AttentionCapture(
                "aiayn.visualization.bert_attention:bert_attention",
                "text",
                files=tuple(f"{view}_{m}" for view in ("self", "mask") for m in _MAPS),
            ),
            training=Training(
                "aiayn.training.config:BertDataConfig",
                {
                    "masked-lm": "aiayn.training.masked_lm:MaskedLMTask",
                    "classification": "aiayn.training.text_classification:TextClassificationTask",
                },
                "BERT training",
                init_from=True,
                check="aiayn.training.bert_start:check_bert_run",
                adapt="aiayn.training.bert_start:bert_task_model",
            ),
            first_layer=_FIRST_LAYER + "bert_first_layer",
            quantize=QuantizePolicy(keep=("pooler", "mlm_head", "classifier")),
        ),
        Family(
            name="vit",
            title="ViT",
            config=ViTConfig,
            model=ViT,
            presets=VIT_PRESETS,
            default_preset="vit-tiny-digits",
            count=expected_vit_parameters,
            commands=frozenset({"classify-image", "attention"}),
            modules=(
                "aiayn.models.vit",
                "aiayn.convert.vit",
                "aiayn.convert.vit_to_hf",
                "aiayn.training.images",
            ),
            reads="image",
            from_hf={
                "vit": HFSource(
                    "aiayn.convert.vit:vit_from_hf_tensors",
                    "aiayn.convert.vit:vit_preprocessor_from_hf",
                )
            },
            to_onnx="aiayn.convert.to_onnx:vit_to_onnx",
            to_hf="aiayn.convert.vit_to_hf:vit_to_hf",
            inference="aiayn.inference.encoder:ViTInference",
            attention=AttentionCapture(
                "aiayn.visualization.image_view:image_attention",
                "image",
                files=("cls_L*_H*.png", "cls_L*_all.png", "rollout.png"),
                pages=("attention.html", "head_view.html"),
            ),
            training=Training(
                "aiayn.training.config:ImageDataConfig",
                {"image-classification": "aiayn.training.images:ImageClassificationTask"},
                "image classification",
                check="aiayn.training.images:check_image_run",
                demos={"vit": "aiayn.training.images:VIT_DEMO_CONFIG"},
            ),
            first_layer=_FIRST_LAYER + "vit_first_layer",
            quantize=QuantizePolicy(keep=("pooler", "classifier")),
        ),
    )
}
"""Every family, by name."""

DEFAULT_FAMILY = "transformer"
"""The family of a run config without ``model.family``, and of a checkpoint written before
families existed (format 1 holds only the paper's model)."""


def family_named(name: str) -> Family:
    """The family called ``name``; an unknown one is a :class:`UserError` naming it."""
    if name not in FAMILIES:
        raise UserError(f"unknown model family {name!r} (known: {', '.join(FAMILIES)})")
    return FAMILIES[name]


def family_of(model: nn.Module) -> Family:
    """The registered family of ``model`` (by its exact class)."""
    for family in FAMILIES.values():
        if type(model) is family.model:
            return family
    raise TypeError(f"{type(model).__name__} is not a registered model family")


def family_of_config(config: ModelConfig) -> Family:
    """The registered family whose config class ``config`` is (exactly)."""
    for family in FAMILIES.values():
        if type(config) is family.config:
            return family
    raise TypeError(f"{type(config).__name__} is not a registered family config")


def family_of_preset(name: str) -> Family:
    """The family that has a preset called ``name``."""
    for family in FAMILIES.values():
        if name in family.presets:
            return family
    raise UserError(f"unknown preset {name!r} (choose from {', '.join(preset_names())})")


def preset_names() -> list[str]:
    """Every family's presets, family by family."""
    return [name for family in FAMILIES.values() for name in family.presets]


def trainable() -> dict[str, Family]:
    """The families ``aiayn train`` can train, by name."""
    return {name: f for name, f in FAMILIES.items() if f.training is not None}


def refuse_unless_serving(family: Family, command: str, where: object) -> None:
    """A :class:`UserError` naming ``where`` (a checkpoint folder), its family and the families
    that serve ``command``, unless ``family`` does."""
    if not family.supports(command):
        names = " or ".join(f.name for f in families_serving(command))
        raise UserError(f"{where} holds a {family.name} model; this needs a checkpoint of {names}")


def demo_runs() -> dict[str, str]:
    """The built-in training runs, by ``--demo`` name (the first is the default) -> their run
    config's reference."""
    return {
        name: ref
        for family in FAMILIES.values()
        if family.training is not None
        for name, ref in family.training.demos.items()
    }


def families_serving(command: str) -> list[Family]:
    """The families whose checkpoints serve ``command``."""
    return [f for f in FAMILIES.values() if f.supports(command)]


def hf_source(model_type: object) -> tuple[Family, HFSource]:
    """The family and converter of a Hugging Face ``model_type``; an unsupported one is a
    :class:`UserError` naming it and the supported ones."""
    for family in FAMILIES.values():
        if isinstance(model_type, str) and model_type in family.from_hf:
            return family, family.from_hf[model_type]
    supported = [t for f in FAMILIES.values() for t in f.from_hf]
    raise UserError(
        f"model_type {model_type!r} is not supported yet (supported: {', '.join(supported)})"
    )


def conversion_directions() -> str:
    """What converts each way, in one sentence (``aiayn convert --help``)."""
    sources = [f"{f.title} ({', '.join(f.from_hf)})" for f in FAMILIES.values() if f.from_hf]
    back = [f.title for f in FAMILIES.values() if f.to_hf is not None]
    return (
        f"From Hugging Face (by config.json's model_type): {', '.join(sources)}. "
        f"Back to Hugging Face: {', '.join(back) or 'none yet'}."
    )
