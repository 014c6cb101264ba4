"""What an encoder-only model (BERT) is used for without training: filling in masked tokens (the
masked-LM objective of Devlin et al. 2019, §3.1 "Task #1") and sentence embeddings (mean pooling
over the real tokens, then L2 normalisation, as sentence-transformers models do; Reimers &
Gurevych 2019, §3).

Both run the model through :class:`~aiayn.inference.encoder.BertInference`: its blocks
on the real tokens only, the same states at real positions as the model's ``forward``.

Shape legend:  B texts in a batch   S tokens   D d_model   V vocabulary   k predictions kept
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.errors import UserError
from aiayn.inference.encoder import BertInference
from aiayn.inference.packed import pack_for_inference
from aiayn.models.bert import BERT


class Prediction(NamedTuple):
    """One candidate for a masked position: its id, token, probability and the filled text."""

    token_id: int
    token: str
    probability: float
    sequence: str


@torch.no_grad()
def fill_mask(
    model: BERT, tokenizer: BertTokenizer, text: str, *, top_k: int = 5
) -> list[list[Prediction]]:
    """The ``top_k`` most probable tokens at each ``[MASK]`` of ``text``, most probable first:
    one list per mask, left to right. Each prediction's sequence is the text with that mask
    filled (other masks left as they are), decoded without special tokens.

    Raises:
        UserError: when ``text`` has no mask token, or one past the tokens the model reads
            (the text is truncated to them), or ``top_k`` is not in 1..V.
    """
    if not 1 <= top_k <= model.config.vocab_size:
        raise UserError(f"top-k must be in 1..{model.config.vocab_size}, got {top_k}")
    encoded = tokenizer.encode(text)
    device = next(model.parameters()).device
    ids = torch.tensor([encoded.ids], device=device)  # (1, S)
    where = (ids[0] == tokenizer.mask_id).nonzero()[:, 0].tolist()
    mask = tokenizer.convert_ids_to_tokens(tokenizer.mask_id)
    written = text.count(mask)
    if len(where) < written:
        which = (
            f"the {mask} lies"
            if written == 1
            else f"{written - len(where)} of the {written} {mask} lie"
        )
        raise UserError(
            f"{which} past the {len(encoded.ids)} tokens the model reads (the text is cut "
            "there): shorten the text"
        )
    if not where:
        raise UserError(f"no {mask} in {text!r}")
    model.eval()
    types = torch.tensor([encoded.token_types], device=device)  # (1, S)
    hidden = BertInference(model)(ids, types).hidden  # (1, S, D)
    probs = torch.softmax(model.mlm_logits(hidden[:, where]).float(), dim=-1)[0]  # (M, V)
    top = probs.topk(top_k, dim=-1)  # (M, k)
    results = []
    for m, position in enumerate(where):
        row = []
        for p, token_id in zip(top.values[m].tolist(), top.indices[m].tolist(), strict=True):
            filled = list(encoded.ids)
            filled[position] = token_id
            sequence = tokenizer.decode(filled)
            token = tokenizer.decode([token_id], skip_special_tokens=False)
            row.append(Prediction(token_id, token, p, sequence))
        results.append(row)
    return results


@torch.no_grad()
def sentence_embeddings(
    model: BERT,
    tokenizer: BertTokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 32,
    normalize: bool = True,
    pack: bool = True,
) -> Tensor:
    """(N, D) embeddings of ``texts``: the mean of the final states over each text's real tokens
    ([CLS] and [SEP] included, padding not), L2-normalised unless ``normalize`` is False.

    ``pack``: on CPU, run a copy of the model whose linear layers are packed for oneDNN
    (:func:`~aiayn.inference.packed.pack_for_inference`, made once per call; same fp32
    arithmetic up to summation order). Ignored on GPU.
    """
    if batch_size < 1:
        raise UserError(f"batch size must be >= 1, got {batch_size}")
    model.eval()
    device = next(model.parameters()).device
    encode = BertInference(pack_for_inference(model) if pack else model)
    out = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer.encode_batch(list(texts[start : start + batch_size])).to(device)
        hidden = encode(batch.ids, batch.token_types, batch.attention_mask).hidden  # (B, S, D)
        real = batch.attention_mask[:, :, None].to(hidden.dtype)  # (B, S, 1)
        mean = (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)  # (B, D)
        out.append(F.normalize(mean.float(), dim=-1) if normalize else mean.float())
    if not out:
        return torch.empty(0, model.config.d_model)
    return torch.cat(out)  # (N, D)


def cosine_similarities(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise cosine similarity of two (N, D) embedding matrices: (N,)."""
    if a.shape != b.shape:
        raise UserError(f"need as many texts on both sides, got {a.size(0)} and {b.size(0)}")
    return F.cosine_similarity(a, b, dim=-1) if a.numel() else a.new_zeros(a.size(0))
