"""The tokenizers of pretrained encoder–decoders, T5 and Marian (OPUS-MT), read from a Hugging
Face folder. They give the same ids and the same decoded text as Hugging Face ``transformers``
(5.x): ``tokenizer(text)["input_ids"]`` without its final EOS, and
``decode(ids, skip_special_tokens=True)``.

**T5** (:class:`T5Tokenizer`) reads ``spiece.model`` with ``sentencepiece`` or, when the folder
has only a ``tokenizer.json``, reads that with Hugging Face ``tokenizers``. Its ids are the
SentencePiece ids (``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2 in Google's models), then ``extra_ids``
sentinels ``<extra_id_0>`` … counting down from the top (``<extra_id_0>`` is the largest id).
``transformers`` 5 has no SentencePiece-backed ("slow") T5 tokenizer any more: it converts
``spiece.model`` into a ``tokenizers`` pipeline (the model's normaliser, a split on Unicode
whitespace, then "▁" before each word). Encoding with ``sentencepiece`` gives the same ids,
except that

* text that spells a special token (``</s>``, ``<pad>``, ``<unk>``, ``<extra_id_3>``) is that
  token, and the text after it starts a new word, as in Hugging Face: :class:`T5Tokenizer`
  splits the text there first;
* Hugging Face splits words at Unicode whitespace that the model's normaliser leaves in place
  (``U+0085`` for T5's ``nmt_nfkc``), where SentencePiece sees an unknown character:
  :class:`T5Tokenizer` splits there too;
* Hugging Face's normaliser works on grapheme clusters, SentencePiece's on characters, so a
  combining mark with no letter of its own before it (after a space, a ligature, a full-width
  letter, or a second mark on one letter) can come out differently. That is not reproduced.

Decoding skips the special ids (pad, EOS, unk, the sentinels) and joins the pieces as
Hugging Face's ``Metaspace`` decoder does ("▁" is a space; the first piece loses its "▁").

**Marian** (:class:`MarianTokenizer`) reads ``source.spm``, ``target.spm`` and ``vocab.json``
(one vocabulary for both sides) or, with ``"separate_vocabs": true`` in
``tokenizer_config.json``, ``vocab.json`` (source) and ``target_vocab.json`` (target), as
``transformers.MarianTokenizer`` does: source text → pieces of the source model → ids of the
vocabulary (a piece not in it → ``<unk>``). A language code such as ``>>de<<`` at the start of
the text (or right after a special token) is one token: its vocabulary id, ``<unk>`` when it has
none. Decoding skips ``</s>``, ``<unk>`` and ``<pad>`` and turns the rest into text with
a SentencePiece model: the target one with separate vocabularies, the source one with a joint
vocabulary (Hugging Face's choice; both give the same text). The special ids are those of the
source vocabulary, as in Hugging Face. Hugging Face's Moses punctuation normaliser is not applied
(``transformers`` 5 does not call it either).

Neither adds special tokens when encoding (the caller appends ``eos_id``) nor a task prefix
(T5's ``"translate English to German: "`` is the caller's text). Both save into an aiayn
checkpoint folder with the Hugging Face file names plus a manifest, ``pretrained_tokenizer.json``
(see :meth:`T5Tokenizer.save`), which :func:`load_pretrained_tokenizer` reads back.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import sentencepiece as spm
from tokenizers import Tokenizer as _HFTokenizer

from aiayn.errors import UserError
from aiayn.validation import is_int_at_least

__all__ = [
    "MANIFEST",
    "MarianTokenizer",
    "PretrainedTokenizer",
    "T5Tokenizer",
    "TranslationTokenizer",
    "load_pretrained_tokenizer",
    "pretrained_tokenizer_from_hf",
]

MANIFEST = "pretrained_tokenizer.json"
"""The manifest's file name in an aiayn checkpoint folder."""
_FORMAT, _VERSION = "aiayn-pretrained-tokenizer", 1

T5_SPM, TOKENIZER_JSON = "spiece.model", "tokenizer.json"
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
VOCAB, TARGET_VOCAB = "vocab.json", "target_vocab.json"
TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, MODEL_CONFIG = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
)

_T = TypeVar("_T")
_SPACE = "\u2581"  # SentencePiece's "▁"
_SENTINEL = re.compile(r"<extra_id_(\d+)>")
# Unicode White_Space: where Rust's char::is_whitespace, so Hugging Face's WhitespaceSplit, cuts.
_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000"
)


class TranslationTokenizer(Protocol):
    """What decoding needs of a vocabulary: aiayn's own :class:`~aiayn.data.tokenizer.Tokenizer`,
    :class:`T5Tokenizer` and :class:`MarianTokenizer` all provide it.

    ``encode_batch`` gives source ids without specials (the caller appends ``eos_id``),
    ``encode_target_batch`` target ids (for training: Marian's target side has a SentencePiece
    model of its own); ``decode_batch`` skips special ids; ``bos_id`` is the decoder's first input.
    """

    @property
    def pad_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def bos_id(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def encode_target_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]: ...


# ----------------------------------------------------------------------------------- T5


class _SpecialIds:
    """The special ids a pretrained encoder–decoder's tokenizer gives its decoding (set by the
    subclass as ``_pad_id``, ``_eos_id``, ``_unk_id``, ``_bos_id``)."""

    _pad_id: int
    _eos_id: int
    _unk_id: int
    _bos_id: int

    @property
    def pad_id(self) -> int:
        """Padding id."""
        return self._pad_id

    @property
    def eos_id(self) -> int:
        """End-of-sentence id."""
        return self._eos_id

    @property
    def unk_id(self) -> int:
        """Unknown-token id."""
        return self._unk_id

    @property
    def bos_id(self) -> int:
        """The decoder's first input (``decoder_start_token_id``: the pad id in T5 and Marian)."""
        return self._bos_id


class T5Tokenizer(_SpecialIds):
    """T5's SentencePiece vocabulary plus its sentinels, coding as ``transformers.T5Tokenizer``.

    Build one with :func:`pretrained_tokenizer_from_hf` or :func:`load_pretrained_tokenizer`.

    Args:
        model: the ``spiece.model`` (a loaded ``SentencePieceProcessor``) or a Hugging Face
            ``tokenizers.Tokenizer`` (from a ``tokenizer.json``, which holds its own special
            tokens: ``extra_ids``, ``additional_special_tokens`` and ``special_token_ids`` are
            then unused).
        extra_ids: number of sentinels ``<extra_id_0>`` … after the SentencePiece pieces.
        additional_special_tokens: further special tokens (pieces of the model, sentinels, or new
            tokens, which get ids after the sentinels unless ``special_token_ids`` names them).
        special_token_ids: explicit ids of special tokens that are not pieces of the model.
        pad_token, eos_token, unk_token: the special tokens' strings.
        bos_id: the decoder start id (T5's ``decoder_start_token_id``); None: the pad id.
        clean_up_tokenization_spaces: remove the space before ``.``, ``,``, ``n't`` … after
            decoding, as Hugging Face does when a folder's tokenizer_config.json asks for it.
    """

    def __init__(
        self,
        model: spm.SentencePieceProcessor | _HFTokenizer,
        *,
        extra_ids: int = 100,
        additional_special_tokens: Sequence[str] = (),
        special_token_ids: Mapping[str, int] | None = None,
        pad_token: str = "<pad>",
        eos_token: str = "</s>",
        unk_token: str = "<unk>",
        bos_id: int | None = None,
        clean_up_tokenization_spaces: bool = False,
    ) -> None:
        self._model = model
        names = (pad_token, eos_token, unk_token)
        if isinstance(model, _HFTokenizer):
            self._extra_ids = 0
            added = model.get_added_tokens_decoder()
            self._special = {t.content: i for i, t in sorted(added.items()) if t.special}
            ids = [model.token_to_id(name) for name in names]
            self._vocab_size = int(model.get_vocab_size(with_added_tokens=True))
        else:
            if not is_int_at_least(extra_ids, 0):
                raise UserError(f"extra_ids must be an integer >= 0, got {extra_ids!r}")
            self._extra_ids = extra_ids
            self._special = _t5_special_ids(
                model, extra_ids, [*names, *additional_special_tokens], special_token_ids or {}
            )
            ids = [self._special[name] for name in names]
            n = int(model.get_piece_size())
            self._vocab_size = max(n + extra_ids, *(i + 1 for i in self._special.values()))
            self._pieces: list[str] = [model.id_to_piece(i) for i in range(n)]
            # Text is cut at special tokens (longest first) and, as Hugging Face's WhitespaceSplit
            # does, at whitespace the model's normaliser keeps as it is (SentencePiece splits
            # words only at the spaces it makes).
            self._special_re = _alternation(self._special)
            kept = [c for c in _WHITESPACE if any(x in _WHITESPACE for x in _normalized(model, c))]
            self._split_re = re.compile(f"[{re.escape(''.join(kept))}]+") if kept else None
        missing = [name for name, token_id in zip(names, ids, strict=True) if token_id is None]
        if missing:
            raise UserError(f"special token {missing[0]!r} is not in the T5 vocabulary")
        self._pad_id, self._eos_id, self._unk_id = (int(i) for i in ids if i is not None)
        self._tokens = dict(zip(("pad_token", "eos_token", "unk_token"), names, strict=True))
        self._bos_id = (
            self._pad_id
            if bos_id is None
            else _check_id(bos_id, "the decoder start id (bos_id)", self)
        )
        self._special_ids = frozenset(self._special.values()) | {self._pad_id, self._eos_id}
        self._clean_up = bool(clean_up_tokenization_spaces)

    # ----------------------------------------------------------------------------- properties

    @property
    def vocab_size(self) -> int:
        """Number of ids, sentinels included (Hugging Face's ``len(tokenizer)``; the model's
        embedding may be larger, e.g. 32128 rows for 32100 ids)."""
        return self._vocab_size

    @property
    def special_tokens(self) -> dict[str, int]:
        """Every special token (skipped when decoding, one token when spelled in text) → id."""
        return dict(self._special)

    def id_to_token(self, token_id: int, *, target: bool = False) -> str | None:
        """The piece (``▁`` marks a word start) or special token of ``token_id``, or None
        outside the vocabulary; ``target`` is accepted for the protocol's sake (T5 has one
        vocabulary for both sides)."""
        if isinstance(self._model, _HFTokenizer):
            token: str | None = self._model.id_to_token(token_id)
            return token
        if 0 <= token_id < len(self._pieces):
            return self._pieces[token_id]
        names = {i: name for name, i in self._special.items()}
        return names.get(token_id)

    # ----------------------------------------------------------------------------- coding

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, no EOS added."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """:meth:`encode` for many texts (one SentencePiece call for all their words)."""
        if isinstance(self._model, _HFTokenizer):
            return [
                list(e.ids) for e in self._model.encode_batch(list(texts), add_special_tokens=False)
            ]
        plans: list[list[int | str]] = []
        words: list[str] = []
        for text in texts:
            plan: list[int | str] = []
            for segment in _split_at(self._special_re, text):
                if segment in self._special:
                    plan.append(self._special[segment])
                elif segment:
                    parts = self._split_re.split(segment) if self._split_re else [segment]
                    plan.extend(p for p in parts if p)
            plans.append(plan)
            words.extend(p for p in plan if isinstance(p, str))
        encoded = iter(self._model.encode(words) if words else [])
        out: list[list[int]] = []
        for plan in plans:
            ids: list[int] = []
            for item in plan:
                if isinstance(item, int):
                    ids.append(item)
                else:
                    ids.extend(next(encoded))
            out.append(ids)
        return out

    def encode_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Target ids of ``texts``: T5 codes both sides alike (:meth:`encode_batch`)."""
        return self.encode_batch(texts)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, special tokens skipped."""
        return self.decode_batch([ids])[0]

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """:meth:`decode` for many id sequences."""
        if isinstance(self._model, _HFTokenizer):
            rows = [[int(i) for i in ids] for ids in batch]
            texts = list(self._model.decode_batch(rows, skip_special_tokens=True))
        else:
            texts = [self._decode_pieces(ids) for ids in batch]
        return [_clean_up(t) for t in texts] if self._clean_up else texts

    def _decode_pieces(self, ids: Iterable[int]) -> str:
        specials, pieces, n = self._special_ids, self._pieces, len(self._pieces)
        kept = [pieces[i] for i in (int(x) for x in ids) if i not in specials and 0 <= i < n]
        if not kept:
            return ""
        # Hugging Face's Metaspace decoder: "▁" is a space, except in the first piece.
        return kept[0].replace(_SPACE, "") + "".join(kept[1:]).replace(_SPACE, " ")

    # ----------------------------------------------------------------------------- saving

    def save(self, folder: str | Path) -> None:
        """Write the vocabulary into ``folder`` (created): ``spiece.model`` or
        ``tokenizer.json``, and the manifest ``pretrained_tokenizer.json``, a JSON object::

            {"format": "aiayn-pretrained-tokenizer", "version": 1, "kind": "t5",
             "files": ["spiece.model"], "pad_token": "<pad>", "eos_token": "</s>",
             "unk_token": "<unk>", "pad_id": 0, "eos_id": 1, "unk_id": 2, "bos_id": 0,
             "vocab_size": 32100, "clean_up_tokenization_spaces": false,
             "extra_ids": 100, "special_tokens": {"<pad>": 0, ..., "<extra_id_0>": 32099, ...}}

        (a Marian manifest has ``"kind": "marian"`` and ``"separate_vocabs"`` instead of the
        last two keys). The manifest is written last, so a folder that has one is complete.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if isinstance(self._model, _HFTokenizer):
            files = [TOKENIZER_JSON]
            _write_bytes(folder / TOKENIZER_JSON, self._model.to_str(pretty=False).encode("utf-8"))
        else:
            files = [T5_SPM]
            _write_bytes(folder / T5_SPM, self._model.serialized_model_proto())
        extra = {"extra_ids": self._extra_ids, "special_tokens": self._special}
        _write_manifest(folder, "t5", files, self, self._tokens, self._clean_up, extra)

    def __repr__(self) -> str:
        backend = "tokenizers" if isinstance(self._model, _HFTokenizer) else "sentencepiece"
        return f"T5Tokenizer(vocab_size={self.vocab_size}, backend={backend!r})"


def _t5_special_ids(
    sp: spm.SentencePieceProcessor,
    extra_ids: int,
    tokens: Sequence[str],
    explicit: Mapping[str, int],
) -> dict[str, int]:
    """Special token → id as ``transformers`` assigns them: a piece of the model keeps its id,
    ``<extra_id_k>`` is ``pieces + extra_ids - 1 - k``, other new tokens follow in order. The
    model's control pieces (``<pad>``, ``</s>``) are special too."""
    n = int(sp.get_piece_size())
    control = [sp.id_to_piece(i) for i in range(n) if sp.is_control(i)]
    sentinels = [f"<extra_id_{k}>" for k in range(extra_ids)]
    special: dict[str, int] = {}
    next_id = n + extra_ids
    for token in [*tokens, *control, *sentinels]:
        if token in special:
            continue
        piece_id = int(sp.piece_to_id(token))
        match = _SENTINEL.fullmatch(token)
        if sp.id_to_piece(piece_id) == token:
            special[token] = piece_id
        elif token in explicit:
            special[token] = int(explicit[token])
        elif match and int(match[1]) < extra_ids:
            special[token] = n + extra_ids - 1 - int(match[1])
        else:
            special[token] = next_id
            next_id += 1
    return special


def _normalized(sp: spm.SentencePieceProcessor, char: str) -> str:
    """What the model's normaliser makes of ``char`` between two letters."""
    return str(sp.normalize(f"a{char}b"))


# ----------------------------------------------------------------------------------- Marian


class MarianTokenizer(_SpecialIds):
    """A Marian (OPUS-MT) vocabulary: two SentencePiece models and one or two id tables, coding
    as ``transformers.MarianTokenizer``.

    Build one with :func:`pretrained_tokenizer_from_hf` or :func:`load_pretrained_tokenizer`.

    Args:
        source, target: the loaded ``source.spm`` and ``target.spm``
            (``SentencePieceProcessor``).
        vocab: piece → id (``vocab.json``): both sides', or the source side's when
            ``target_vocab`` is given.
        target_vocab: the target side's piece → id (``target_vocab.json``), or None.
        eos_token, unk_token, pad_token: special tokens, all in ``vocab``.
        bos_id: the decoder start id (Marian's ``decoder_start_token_id``); None: the pad id.
        clean_up_tokenization_spaces: as for :class:`T5Tokenizer`.
    """

    def __init__(
        self,
        source: spm.SentencePieceProcessor,
        target: spm.SentencePieceProcessor,
        vocab: Mapping[str, int],
        target_vocab: Mapping[str, int] | None = None,
        *,
        eos_token: str = "</s>",
        unk_token: str = "<unk>",
        pad_token: str = "<pad>",
        bos_id: int | None = None,
        clean_up_tokenization_spaces: bool = False,
    ) -> None:
        self._source, self._target = source, target
        self._vocab = dict(vocab)
        self._target_vocab = None if target_vocab is None else dict(target_vocab)
        names = {"eos_token": eos_token, "unk_token": unk_token, "pad_token": pad_token}
        for key, token in names.items():
            if token not in self._vocab:
                raise UserError(f"the {key.split('_')[0]} token {token!r} is not in {VOCAB}")
        self._tokens = names
        self._eos_id, self._unk_id, self._pad_id = (self._vocab[t] for t in names.values())
        self._bos_id = (
            self._pad_id
            if bos_id is None
            else _check_id(bos_id, "the decoder start id (bos_id)", self)
        )
        self._clean_up = bool(clean_up_tokenization_spaces)
        self._special_tokens = frozenset(names.values())
        self._special_ids = frozenset((self._eos_id, self._unk_id, self._pad_id))
        self._special_re = _alternation(self._special_tokens)
        decoding_vocab = self._vocab if self._target_vocab is None else self._target_vocab
        self._id_to_token = {i: t for t, i in decoding_vocab.items()}
        self._source_id_to_token: dict[int, str] | None = None  # separate vocabularies: on use
        # Hugging Face turns target pieces into text with the source model when the vocabulary
        # is joint (its default use_source_tokenizer), with the target model otherwise.
        self._decoder_spm = source if self._target_vocab is None else target

    @property
    def vocab_size(self) -> int:
        """Number of source ids (``len(vocab.json)``, Hugging Face's ``vocab_size``)."""
        return len(self._vocab)

    @property
    def target_vocab_size(self) -> int:
        """Number of target ids: ``vocab_size`` unless the vocabularies are separate."""
        return len(self._vocab if self._target_vocab is None else self._target_vocab)

    @property
    def separate_vocabs(self) -> bool:
        """Whether source and target have vocabularies of their own."""
        return self._target_vocab is not None

    def id_to_token(self, token_id: int, *, target: bool = False) -> str | None:
        """The piece (``▁`` marks a word start) or special token of a source id, or with
        ``target`` of a target id (the vocabularies may be separate), or None outside it."""
        if target or self._target_vocab is None:
            return self._id_to_token.get(token_id)  # the target's table (the joint one)
        if self._source_id_to_token is None:
            self._source_id_to_token = {i: t for t, i in self._vocab.items()}
        return self._source_id_to_token.get(token_id)

    def encode(self, text: str) -> list[int]:
        """Source ids of ``text``, no EOS added."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """:meth:`encode` for many texts (one SentencePiece call for all)."""
        return self._encode(texts, self._source, self._vocab)

    def encode_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Target ids of ``texts``, no EOS added, as ``tokenizer(text_target=...)`` gives them:
        pieces of the target SentencePiece model, ids of the target vocabulary (the joint one
        unless the vocabularies are separate)."""
        return self._encode(texts, self._target, self._target_vocab or self._vocab)

    def _encode(
        self, texts: Sequence[str], model: spm.SentencePieceProcessor, vocab: Mapping[str, int]
    ) -> list[list[int]]:
        """Ids of ``texts`` by the pieces of ``model`` and the ids of ``vocab`` (its ``<unk>``
        for what it lacks); special tokens spelled in the text keep their source ids, as in
        Hugging Face."""
        unk = vocab.get(self._tokens["unk_token"], self._unk_id)
        plans: list[list[int | str]] = []
        for text in texts:
            plan: list[int | str] = []
            for segment in _split_at(self._special_re, text):
                if segment in self._special_tokens:
                    plan.append(self._vocab[segment])
                elif segment:
                    code, rest = _language_code(segment)
                    if code:
                        plan.append(vocab.get(code, unk))
                    plan.append(rest)
            plans.append(plan)
        words = [p for plan in plans for p in plan if isinstance(p, str)]
        encoded = iter(model.encode(words, out_type=str) if words else [])
        out: list[list[int]] = []
        for plan in plans:
            ids: list[int] = []
            for item in plan:
                if isinstance(item, int):
                    ids.append(item)
                else:
                    ids.extend(vocab.get(piece, unk) for piece in next(encoded))
            out.append(ids)
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Text of target ``ids``, ``</s>``, ``<unk>`` and ``<pad>`` skipped."""
        text = self._decode(ids)
        return _clean_up(text) if self._clean_up else text

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """:meth:`decode` for many id sequences."""
        return [self.decode(ids) for ids in batch]

    def _decode(self, ids: Iterable[int]) -> str:
        sp, size = self._decoder_spm, int(self._decoder_spm.get_piece_size())
        tokens: list[str] = []
        for i in (int(x) for x in ids):
            if i in self._special_ids:
                continue
            token = self._id_to_token.get(i)
            if token is None:  # not in the vocabulary: the model's piece (Hugging Face's fallback)
                if not 0 <= i < size:
                    continue  # (Hugging Face raises IndexError)
                token = sp.id_to_piece(i) or self._tokens["unk_token"]
            tokens.append(token)
        # Hugging Face's convert_tokens_to_string: special tokens are not SentencePiece's.
        text, pieces = "", list[str]()
        for token in tokens:
            if token in self._special_tokens:
                text += sp.decode_pieces(pieces) + token + " "
                pieces = []
            else:
                pieces.append(token)
        text += sp.decode_pieces(pieces)
        return text.replace(_SPACE, " ").strip()

    def save(self, folder: str | Path) -> None:
        """Write ``source.spm``, ``target.spm``, ``vocab.json`` (and ``target_vocab.json``) and
        the manifest ``pretrained_tokenizer.json`` into ``folder`` (see :meth:`T5Tokenizer.save`).
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        files = [SOURCE_SPM, TARGET_SPM, VOCAB]
        _write_bytes(folder / SOURCE_SPM, self._source.serialized_model_proto())
        _write_bytes(folder / TARGET_SPM, self._target.serialized_model_proto())
        _write_bytes(folder / VOCAB, _json_bytes(self._vocab))
        if self._target_vocab is not None:
            files.append(TARGET_VOCAB)
            _write_bytes(folder / TARGET_VOCAB, _json_bytes(self._target_vocab))
        extra = {"separate_vocabs": self.separate_vocabs}
        _write_manifest(folder, "marian", files, self, self._tokens, self._clean_up, extra)

    def __repr__(self) -> str:
        return (
            f"MarianTokenizer(vocab_size={self.vocab_size}, "
            f"target_vocab_size={self.target_vocab_size})"
        )


def _language_code(text: str) -> tuple[str, str]:
    """(``">>de<<"``, rest) when ``text`` starts with a language code, else ("", text)."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return text[: end + 2], text[end + 2 :]
    return "", text


PretrainedTokenizer = T5Tokenizer | MarianTokenizer
"""Either pretrained tokenizer."""

if TYPE_CHECKING:  # all three vocabularies are TranslationTokenizers
    from aiayn.data.tokenizer import Tokenizer

    _CHECK: tuple[type[TranslationTokenizer], ...] = (Tokenizer, T5Tokenizer, MarianTokenizer)


# ----------------------------------------------------------------------------------- folders


def pretrained_tokenizer_from_hf(folder: str | Path, model_type: str) -> PretrainedTokenizer | None:
    """The tokenizer of a Hugging Face model folder, or None when ``model_type`` (config.json's
    ``"t5"`` or ``"marian"``) has none here or the folder lacks its files.

    Special tokens, sentinels, ``clean_up_tokenization_spaces`` and (Marian) ``separate_vocabs``
    come from ``tokenizer_config.json`` and ``special_tokens_map.json``, the decoder start id
    from ``config.json``'s ``decoder_start_token_id``, where present.

    Raises:
        UserError: naming a file that is there but unreadable (a corrupt SentencePiece model,
            bad JSON, a vocabulary without its special tokens).
    """
    folder = Path(folder)
    kind = model_type.lower()
    if kind == "t5":
        return _t5_from_hf(folder)
    if kind == "marian":
        return _marian_from_hf(folder)
    return None


def _t5_from_hf(folder: Path) -> T5Tokenizer | None:
    settings = _HFSettings(folder)
    kwargs: dict[str, Any] = dict(
        **settings.tokens,
        bos_id=settings.decoder_start_id,
        clean_up_tokenization_spaces=settings.clean_up,
    )
    if (folder / T5_SPM).is_file():
        sentinels = [t for t in settings.additional if _SENTINEL.fullmatch(t)]
        extra_ids = settings.extra_ids
        if extra_ids is None:
            extra_ids = len(sentinels) if sentinels else 100
        model = _load_spm(folder / T5_SPM)
        return _build(
            folder / T5_SPM,
            lambda: T5Tokenizer(
                model,
                extra_ids=extra_ids,
                additional_special_tokens=settings.additional,
                special_token_ids=settings.added_ids,
                **kwargs,
            ),
        )
    if (folder / TOKENIZER_JSON).is_file():
        hf = _load_tokenizer_json(folder / TOKENIZER_JSON)
        return _build(folder / TOKENIZER_JSON, lambda: T5Tokenizer(hf, **kwargs))
    return None


def _marian_from_hf(folder: Path) -> MarianTokenizer | None:
    settings = _HFSettings(folder)
    needed = [SOURCE_SPM, TARGET_SPM, VOCAB] + ([TARGET_VOCAB] if settings.separate_vocabs else [])
    if not all((folder / name).is_file() for name in needed):
        return None
    tokens = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"} | settings.tokens
    return _marian(
        folder, settings.separate_vocabs, tokens, settings.decoder_start_id, settings.clean_up
    )


def _marian(
    folder: Path, separate: bool, tokens: Mapping[str, str], bos_id: int | None, clean_up: bool
) -> MarianTokenizer:
    source, target = _load_spm(folder / SOURCE_SPM), _load_spm(folder / TARGET_SPM)
    vocab = _load_vocab(folder / VOCAB)
    target_vocab = _load_vocab(folder / TARGET_VOCAB) if separate else None
    return _build(
        folder / VOCAB,
        lambda: MarianTokenizer(
            source,
            target,
            vocab,
            target_vocab,
            bos_id=bos_id,
            clean_up_tokenization_spaces=clean_up,
            **tokens,
        ),
    )


def load_pretrained_tokenizer(folder: str | Path) -> PretrainedTokenizer:
    """The tokenizer an aiayn checkpoint folder holds, as :meth:`T5Tokenizer.save` or
    :meth:`MarianTokenizer.save` wrote it.

    Raises:
        UserError: no manifest, a manifest of another format or kind, a missing or corrupt
            file, or ids that differ from the manifest's.
    """
    folder = Path(folder)
    path, manifest = _read_manifest(folder, MANIFEST, _FORMAT, _VERSION, "pretrained tokenizer")
    try:
        tokens: dict[str, Any] = {
            k: str(manifest[k]) for k in ("pad_token", "eos_token", "unk_token")
        }
        bos_id, clean_up = int(manifest["bos_id"]), bool(manifest["clean_up_tokenization_spaces"])
        files = [str(f) for f in manifest["files"]]
        kind = manifest["kind"]
        tokenizer: PretrainedTokenizer
        if kind == "t5" and files == [T5_SPM]:
            special = {str(t): int(i) for t, i in manifest["special_tokens"].items()}
            model = _load_spm(folder / T5_SPM)
            tokenizer = T5Tokenizer(
                model,
                extra_ids=int(manifest["extra_ids"]),
                additional_special_tokens=list(special),
                special_token_ids=special,
                bos_id=bos_id,
                clean_up_tokenization_spaces=clean_up,
                **tokens,
            )
        elif kind == "t5" and files == [TOKENIZER_JSON]:
            hf = _load_tokenizer_json(folder / TOKENIZER_JSON)
            tokenizer = T5Tokenizer(
                hf, bos_id=bos_id, clean_up_tokenization_spaces=clean_up, **tokens
            )
        elif kind == "marian":
            separate = bool(manifest["separate_vocabs"])
            tokenizer = _marian(folder, separate, tokens, bos_id, clean_up)
        else:
            raise UserError(f"{path}: unknown tokenizer kind {kind!r} with files {files}")
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"{path}: malformed manifest ({exc!r})") from None
    keys = ("pad_id", "eos_id", "unk_id", "vocab_size")
    _check_manifest_ids(path, manifest, tokenizer, keys, "the tokenizer files")
    return tokenizer


# ----------------------------------------------------------------------------------- helpers


class _HFSettings:
    """What a Hugging Face folder's tokenizer_config.json, special_tokens_map.json and
    config.json say about the tokenizer (all optional)."""

    def __init__(self, folder: Path) -> None:
        config = _read_json_object(folder / TOKENIZER_CONFIG, missing_ok=True)
        special_map = _read_json_object(folder / SPECIAL_TOKENS_MAP, missing_ok=True)
        model_config = _read_json_object(folder / MODEL_CONFIG, missing_ok=True)
        self.tokens: dict[str, str] = {}
        for key in ("pad_token", "eos_token", "unk_token"):
            token = _token(config.get(key)) or _token(special_map.get(key))
            if token:
                self.tokens[key] = token
        additional = _additional_special_tokens((config, special_map))
        self.added_ids: dict[str, int] = {}
        decoder = config.get("added_tokens_decoder")
        for key, value in decoder.items() if isinstance(decoder, Mapping) else []:
            token = _token(value)
            if token and str(key).isdigit():
                self.added_ids[token] = int(key)
                if isinstance(value, Mapping) and value.get("special") and token not in additional:
                    additional.append(token)
        self.additional = additional
        extra_ids = config.get("extra_ids")
        self.extra_ids = extra_ids if isinstance(extra_ids, int) and extra_ids >= 0 else None
        self.clean_up = config.get("clean_up_tokenization_spaces") is True
        self.separate_vocabs = config.get("separate_vocabs") is True
        start = model_config.get("decoder_start_token_id")
        self.decoder_start_id = start if isinstance(start, int) and start >= 0 else None


def _token(value: object) -> str | None:
    """A token string from its JSON form: a string or an AddedToken's ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _additional_special_tokens(sources: Iterable[Mapping[str, Any]]) -> list[str]:
    """The ``additional_special_tokens`` and ``extra_special_tokens`` (lists, or mappings of
    them) of a Hugging Face folder's JSON ``sources``, in order, each once."""
    additional: list[str] = []
    for source in sources:
        for key in ("additional_special_tokens", "extra_special_tokens"):
            values = source.get(key)
            if isinstance(values, Mapping):
                values = list(values.values())
            for value in values if isinstance(values, list) else []:
                token = _token(value)
                if token and token not in additional:
                    additional.append(token)
    return additional


def _read_manifest(
    folder: Path, name: str, form: str, version: int, what: str
) -> tuple[Path, dict[str, Any]]:
    """(path, contents) of the manifest file ``name`` in ``folder`` that an aiayn checkpoint's
    ``what`` ("pretrained tokenizer") was saved with, in format ``form``, ``version``.

    Raises:
        UserError: no such file, or a manifest of another format or version.
    """
    path = folder / name
    if not path.is_file():
        raise UserError(f"no {what} in {folder} ({name} not found)")
    manifest = _read_json_object(path)
    if manifest.get("format") != form or manifest.get("version") != version:
        kind = what.replace(" ", "-")
        raise UserError(
            f"{path}: not an aiayn {kind} manifest (format {form!r}, version {version})"
        )
    return path, manifest


def _check_manifest_ids(
    path: Path, manifest: Mapping[str, Any], tokenizer: object, keys: Iterable[str], source: str
) -> None:
    """Refuse a tokenizer read from ``source`` whose ``keys`` (ids, vocabulary size) differ
    from those its manifest at ``path`` recorded."""
    for key in keys:
        if manifest.get(key) != getattr(tokenizer, key):
            raise UserError(
                f"{path}: {key} is {manifest.get(key)!r} in the manifest but "
                f"{getattr(tokenizer, key)} in {source}"
            )


def _read_json_object(path: Path, *, missing_ok: bool = False) -> dict[str, Any]:
    if missing_ok and not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _load_vocab(path: Path) -> dict[str, int]:
    data = _read_json_object(path)
    bad = next((k for k, v in data.items() if isinstance(v, bool) or not isinstance(v, int)), None)
    if bad is not None:
        raise UserError(f"{path}: not a vocabulary (token {bad!r} maps to {data[bad]!r})")
    return data


def _load_spm(path: Path) -> spm.SentencePieceProcessor:
    """A SentencePiece model from ``path``."""
    try:
        data = path.read_bytes()
        model = spm.SentencePieceProcessor()
        model.LoadFromSerializedProto(data)
    except Exception as exc:  # OSError, or sentencepiece's RuntimeError on a bad model
        raise UserError(f"{path}: not a readable SentencePiece model ({exc})") from None
    return model


def _load_tokenizer_json(path: Path) -> _HFTokenizer:
    """The ``tokenizers`` pipeline of a tokenizer.json, without the padding and truncation a
    folder may have saved with it (transformers applies them only when a call asks)."""
    try:
        tokenizer = _HFTokenizer.from_str(path.read_text(encoding="utf-8"))
    except Exception as exc:  # OSError, bad UTF-8/JSON, or tokenizers' bare Exception
        raise UserError(f"{path}: not a valid tokenizer JSON file ({exc})") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _build(path: Path, make: Callable[[], _T]) -> _T:
    """``make()``, its UserError prefixed with the file it is about."""
    try:
        return make()
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None


def _check_id(value: object, name: str, tokenizer: T5Tokenizer | MarianTokenizer) -> int:
    size = tokenizer.vocab_size
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise UserError(f"{name} must be an id of the vocabulary (0..{size - 1}), got {value!r}")
    return value


def _alternation(tokens: Iterable[str]) -> re.Pattern[str] | None:
    """A pattern that finds any of ``tokens`` (the longest where several start at one place)."""
    ordered = sorted(set(tokens), key=lambda t: (-len(t), t))
    return re.compile("(" + "|".join(map(re.escape, ordered)) + ")") if ordered else None


def _split_at(pattern: re.Pattern[str] | None, text: str) -> list[str]:
    """``text`` cut before and after each match of ``pattern``, matches kept (empty parts too)."""
    return pattern.split(text) if pattern is not None else [text]


def _clean_up(text: str) -> str:
    """Hugging Face's ``clean_up_tokenization``: no space before punctuation and contractions."""
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


def _json_bytes(data: object) -> bytes:
    return json.dumps(data, ensure_ascii=False, indent=2).encode("utf-8")


def _write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` atomically (a temporary file renamed over ``path``)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_manifest(
    folder: Path,
    kind: str,
    files: list[str],
    tokenizer: T5Tokenizer | MarianTokenizer,
    tokens: Mapping[str, str],
    clean_up: bool,
    extra: Mapping[str, object],
) -> None:
    manifest: dict[str, object] = {"format": _FORMAT, "version": _VERSION, "kind": kind}
    manifest["files"] = files
    manifest.update(tokens)
    for key in ("pad_id", "eos_id", "unk_id", "bos_id", "vocab_size"):
        manifest[key] = getattr(tokenizer, key)
    manifest["clean_up_tokenization_spaces"] = clean_up
    manifest.update(extra)
    _write_bytes(folder / MANIFEST, _json_bytes(manifest))
