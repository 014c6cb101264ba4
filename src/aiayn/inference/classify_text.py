"""Sequence classification with a BERT classifier (Devlin et al. 2019, §4.1: softmax(C Wᵀ) on
the pooled ``[CLS]`` state): the most probable labels of texts or text pairs. The encoder runs
through :class:`~aiayn.inference.encoder.BertInference` (its blocks on the real tokens
only), held equal to the model's own forward by tests/inference/test_encoder.py.

Shape legend:  B texts in a batch   S tokens   C labels   k labels kept
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.errors import UserError
from aiayn.inference.encoder import BertInference
from aiayn.models.bert import BERT


@torch.no_grad()
def classify_texts(
    model: BERT,
    tokenizer: BertTokenizer,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    top_k: int = 1,
    batch_size: int = 32,
) -> list[list[tuple[int, float]]]:
    """The ``top_k`` (label id, probability) pairs of each text (with ``pairs``: of each
    ``[CLS] text [SEP] pair [SEP]``), most probable first. Texts longer than the tokenizer's
    ``model_max_length`` are truncated.

    Raises:
        UserError: a model without a classifier, ``top_k`` outside 1..C, a batch size < 1, or
            as many pairs as texts not given.
    """
    if model.classifier is None:
        raise UserError(f"this BERT has no classifier (head {model.config.head!r})")
    if not 1 <= top_k <= model.config.num_labels:
        raise UserError(f"top-k must be in 1..{model.config.num_labels}, got {top_k}")
    if batch_size < 1:
        raise UserError(f"batch size must be >= 1, got {batch_size}")
    if pairs is not None and len(pairs) != len(texts):
        raise UserError(f"{len(texts)} texts but {len(pairs)} second texts")
    model.eval()
    encode, classifier = BertInference(model), model.classifier
    device = next(model.parameters()).device
    results: list[list[tuple[int, float]]] = []
    for start in range(0, len(texts), batch_size):
        chunk = list(texts[start : start + batch_size])
        second = None if pairs is None else list(pairs[start : start + batch_size])
        batch = tokenizer.encode_batch(chunk, second).to(device)
        pooled = encode(batch.ids, batch.token_types, batch.attention_mask).pooled  # (B, D)
        assert pooled is not None  # the config requires the pooler with a classifier
        logits = classifier(pooled)  # (B, C)
        top = torch.softmax(logits.float(), dim=-1).topk(top_k, dim=-1)  # (B, k)
        for values, indices in zip(top.values.tolist(), top.indices.tolist(), strict=True):
            results.append(list(zip(indices, values, strict=True)))
    return results
