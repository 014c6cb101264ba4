"""aiayn's encoder-only models -> ONNX graphs, through ``torch.onnx.export`` (the ``onnx`` extra:
``onnx`` and ``onnxscript``; ONNX Runtime runs them).

The graph is the model's own forward — aiayn's attention with its boolean masks (True = may
attend), fully masked rows opened for the softmax and zeroed after it, never NaN — traced by the
exporter of ``torch.export`` (``dynamo=True``, PyTorch's default; the TorchScript exporter is
deprecated), with the batch and sequence axes symbolic:

    BERT  input_ids, token_type_ids, attention_mask (B, S) int64
          -> last_hidden_state (B, S, D), pooler_output (B, D) with the pooler,
             logits (B, C) with the classifier or (B, S, V) with the masked-LM head
    ViT   pixel_values (B, C, H, W) float32
          -> last_hidden_state (B, 1 + N, D), pooler_output (B, D) with the pooler,
             logits (B, K) with the classifier

A ViT graph takes any image size ≥ one patch (N = ⌊H/P⌋·⌊W/P⌋ patches): its position
embeddings are resized bicubically in the graph (the identity at the trained size), as the model
does for other sizes. A BERT graph takes up to ``max_len`` positions.

Names follow Hugging Face's (``input_ids``, ``last_hidden_state``…), so ONNX Runtime callers of
transformers' exports find the same inputs and outputs.

Shape legend:  B batch   S sequence   D d_model   C labels (channels for images)   V vocabulary
               H, W image height and width   N patches   K labels
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.errors import UserError

ONNX_FILE = "model.onnx"
"""The graph's file in an exported folder (beside the tokenizer or image preprocessing)."""


@dataclass(frozen=True)
class OnnxGraph:
    """What :func:`write_onnx` exports: a module, example inputs, names and symbolic axes.

    Attributes:
        module: the module traced (in eval mode); its outputs are a tuple of tensors.
        example: one example input per name of ``inputs``.
        inputs, outputs: the graph's input and output names, in order.
        dynamic: per input, its symbolic axes (``torch.export.Dim``), by position.
    """

    module: nn.Module
    example: tuple[Tensor, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dynamic: dict[str, dict[int, Any]]


class _BertGraph(nn.Module):
    """BERT's forward and its head, as a tuple of the outputs the model has."""

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Any:
        out = self.model(input_ids, token_type_ids, attention_mask)
        outputs = [out.hidden] if out.pooled is None else [out.hidden, out.pooled]
        if self.model.classifier is not None:
            outputs.append(self.model.classifier(out.pooled))  # (B, C)
        if self.model.mlm_head is not None:
            outputs.append(self.model.mlm_logits(out.hidden))  # (B, S, V)
        return tuple(outputs)


class _ViTGraph(nn.Module):
    """ViT's forward as a tuple of the outputs the model has."""

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: Tensor) -> Any:
        out = self.model(pixel_values)
        return tuple(x for x in (out.hidden, out.pooled, out.logits) if x is not None)


def bert_to_onnx(model: nn.Module) -> OnnxGraph:
    """BERT's graph: (B, S) ids, token types and attention mask, S up to ``max_len``."""
    from aiayn.models.bert import BERT

    assert isinstance(model, BERT)
    c = model.config
    batch, length = torch.export.Dim("batch"), torch.export.Dim("sequence", max=c.max_len)
    ids = torch.full((2, min(8, c.max_len)), c.pad_id + 1, dtype=torch.long) % c.vocab_size
    names = ("input_ids", "token_type_ids", "attention_mask")
    example = (ids, torch.zeros_like(ids), torch.ones_like(ids))
    outputs = ["last_hidden_state"] + (["pooler_output"] if model.pooler is not None else [])
    if model.classifier is not None or model.mlm_head is not None:
        outputs.append("logits")
    dynamic = {name: {0: batch, 1: length} for name in names}
    return OnnxGraph(_BertGraph(model).eval(), example, names, tuple(outputs), dynamic)


def vit_to_onnx(model: nn.Module) -> OnnxGraph:
    """ViT's graph: (B, C, H, W) images of any size from one patch up."""
    from aiayn.models.vit import ViT

    assert isinstance(model, ViT)
    c = model.config
    pixels = torch.zeros(2, c.num_channels, c.image_size, c.image_size)
    side = {"min": c.patch_size}
    dynamic = {
        "pixel_values": {
            0: torch.export.Dim("batch"),
            2: torch.export.Dim("height", **side),
            3: torch.export.Dim("width", **side),
        }
    }
    outputs = ["last_hidden_state"] + (["pooler_output"] if model.pooler is not None else [])
    if model.classifier is not None:
        outputs.append("logits")
    return OnnxGraph(_ViTGraph(model).eval(), (pixels,), ("pixel_values",), tuple(outputs), dynamic)


_EXPORTER_CHATTER = (
    r"# The axis name: .* will not be used",  # two inputs share one symbolic axis, as meant
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # inside torch.export itself
)
"""Warnings the exporter raises about its own internals, nothing the user can act on."""


def write_onnx(graph: OnnxGraph, folder: Path) -> Path:
    """Export ``graph`` as ``folder/model.onnx`` (``folder`` is created; it must not exist).

    Raises:
        UserError: the exporter refuses the model (its message, in one line).
    """
    folder.mkdir()
    path = folder / ONNX_FILE
    was_training = graph.module.training
    graph.module.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            for message in _EXPORTER_CHATTER:
                warnings.filterwarnings("ignore", message=message)
            torch.onnx.export(
                graph.module,
                graph.example,
                str(path),
                input_names=list(graph.inputs),
                output_names=list(graph.outputs),
                dynamic_shapes=graph.dynamic,
                dynamo=True,
                verbose=False,
            )
    except Exception as error:  # the exporter raises its own error kinds
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"torch.onnx.export could not export the model: {first}") from None
    finally:
        graph.module.train(was_training)
    return path
