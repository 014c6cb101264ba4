"""BERT's tokenizer: the WordPiece vocabulary of BERT checkpoints (and of the models that share
it: DistilBERT, ELECTRA, ...), read from a Hugging Face folder and run by Hugging Face
``tokenizers``. It gives the ids, token type ids, attention masks and decoded text of
``transformers.BertTokenizer`` (5.x; ``BertTokenizerFast`` in 4.x):
``tokenizer(text, pair, truncation=True, max_length=n)`` and
``decode(ids, skip_special_tokens=True)``.

The pipeline is BERT's: ``BertNormalizer`` (control characters removed, whitespace made spaces,
spaces around CJK ideographs, and, as ``tokenizer_config.json`` says, lowercasing
(``do_lower_case``), accent stripping (``strip_accents``; unset: strip when lowercasing) and
``tokenize_chinese_chars``), ``BertPreTokenizer`` (split at whitespace and punctuation),
``WordPiece`` (``##`` continuations, a word longer than 100 characters or with an unknown piece
is ``[UNK]``), ``[CLS] A [SEP]`` or ``[CLS] A [SEP] B [SEP]`` with token type ids 0 (``A``) and
1 (``B``), and the ``WordPiece`` decoder (``##`` pieces joined, no space before ``.``, ``,``,
``n't`` ...). The special tokens (``[CLS]``, ``[SEP]``, ``[PAD]``, ``[MASK]``, ``[UNK]``, or the
names the folder gives) are matched in the raw text before normalising, as in Hugging Face:
``"Paris is the [MASK] of France."`` has the mask id where the text spells it (fill-mask
depends on that), ``"[mask]"`` is ordinary text.

The vocabulary comes from the folder's ``tokenizer.json`` (its WordPiece vocabulary and added
tokens) or, when it has none, from ``vocab.txt`` (one token a line, the line number is the id).
As ``transformers`` does, the settings of ``tokenizer_config.json`` (Hugging Face's defaults
where it is silent: lowercase, CJK split, no clean-up) decide the pipeline, also where a
``tokenizer.json``'s own normaliser, post-processor, decoder or WordPiece limits say otherwise;
its saved padding and truncation are dropped (``transformers`` applies them only when a call
asks for them). Where this tokenizer differs from Hugging Face's:

* a special token that is not in the vocabulary is an error (Hugging Face appends it with a new
  id, which a pretrained model's embedding does not have);
* ``max_length`` below the number of special tokens (2, a pair 3) is an error (Hugging Face
  leaves such input untruncated);
* with no ``max_length``, input is truncated to :attr:`BertTokenizer.model_max_length`, which is
  ``tokenizer_config.json``'s ``model_max_length`` capped by ``config.json``'s
  ``max_position_embeddings``, or the latter alone where the former is unset (Hugging Face
  truncates to ``model_max_length`` only, none where it is unset);
* :meth:`BertTokenizer.convert_ids_to_tokens` raises on an id outside the vocabulary (Hugging
  Face gives None).

:meth:`BertTokenizer.save` writes ``tokenizer.json`` and a manifest, ``bert_tokenizer.json``,
into an aiayn checkpoint folder; :func:`load_bert_tokenizer` reads them back.

Shape legend:  B texts of a batch   T the longest one's tokens (the others padded on the right)
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, overload

import torch
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _HFTokenizer

from aiayn.data.pretrained_tokenizer import (
    MODEL_CONFIG,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    _additional_special_tokens,
    _build,
    _check_manifest_ids,
    _clean_up,
    _json_bytes,
    _load_tokenizer_json,
    _read_json_object,
    _read_manifest,
    _token,
    _write_bytes,
)
from aiayn.errors import UserError
from aiayn.validation import is_int_at_least

__all__ = [
    "MANIFEST",
    "BertBatch",
    "BertTokenizer",
    "Encoded",
    "bert_tokenizer_from_hf",
    "load_bert_tokenizer",
]

MANIFEST = "bert_tokenizer.json"
"""The manifest's file name in an aiayn checkpoint folder."""
_FORMAT, _VERSION = "aiayn-bert-tokenizer", 1
VOCAB_TXT = "vocab.txt"

_PREFIX = "##"  # WordPiece's continuing-subword prefix
_MAX_WORD_CHARS = 100  # longer words are [UNK]
_LARGE = 10**20  # transformers' LARGE_INTEGER: a model_max_length above it means "no limit"
_NAMES = ("cls_token", "sep_token", "pad_token", "mask_token", "unk_token")
_DEFAULT_TOKENS = {
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "mask_token": "[MASK]",
    "unk_token": "[UNK]",
}


class Encoded(NamedTuple):
    """One encoded text (or pair): ``[CLS] A [SEP] (B [SEP])`` ids and their token type ids
    (0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``)."""

    ids: list[int]
    token_types: list[int]


class BertBatch(NamedTuple):
    """Encoded texts padded on the right to one length ``S`` (the longest row): ``ids`` (B, S)
    long, padded with the pad id; ``token_types`` (B, S) long, padded with 0;
    ``attention_mask`` (B, S) bool, True at real tokens. (Not :class:`aiayn.data.Batch`, the
    translation batch.)"""

    ids: torch.Tensor
    token_types: torch.Tensor
    attention_mask: torch.Tensor

    def to(self, device: torch.device | str) -> BertBatch:
        """The three tensors on ``device``."""
        return BertBatch(*(t.to(device) for t in self))


class BertTokenizer:
    """The WordPiece vocabulary of BERT checkpoints, coding as ``transformers.BertTokenizer``.

    Build one with :func:`bert_tokenizer_from_hf` (a Hugging Face folder) or
    :func:`load_bert_tokenizer` (an aiayn checkpoint folder).

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` with a WordPiece model (from a tokenizer.json or a
            vocab.txt). It becomes this object's: its normaliser, pre-tokeniser, post-processor,
            decoder, WordPiece settings and special tokens are set as below, its padding and
            truncation cleared.
        do_lower_case, strip_accents, tokenize_chinese_chars: the ``BertNormalizer`` settings
            (``strip_accents=None``: strip accents when lowercasing).
        cls_token, sep_token, pad_token, mask_token, unk_token: the special tokens' strings;
            each must be in the vocabulary.
        additional_special_tokens: further special tokens (matched in text, skipped when
            decoding); a new one gets the next free id.
        added_tokens: tokens to add as ``transformers``' ``added_tokens_decoder`` lists them
            (in id order, with their matching flags), unless already there.
        model_max_length: the longest encoding (special tokens included) when a call gives no
            ``max_length``; None: no limit.
        clean_up_tokenization_spaces: apply Hugging Face's ``clean_up_tokenization`` after
            decoding (the WordPiece decoder already removes the space before ``.``, ``,`` ...).
    """

    def __init__(
        self,
        tokenizer: _HFTokenizer,
        *,
        do_lower_case: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        cls_token: str = "[CLS]",
        sep_token: str = "[SEP]",
        pad_token: str = "[PAD]",
        mask_token: str = "[MASK]",
        unk_token: str = "[UNK]",
        additional_special_tokens: Sequence[str] = (),
        added_tokens: Sequence[AddedToken] = (),
        model_max_length: int | None = None,
        clean_up_tokenization_spaces: bool = False,
    ) -> None:
        model = tokenizer.model
        if not isinstance(model, models.WordPiece):
            raise UserError(f"not a WordPiece vocabulary (a {type(model).__name__} model)")
        _check_flags(
            do_lower_case=do_lower_case,
            strip_accents=strip_accents,
            tokenize_chinese_chars=tokenize_chinese_chars,
            clean_up_tokenization_spaces=clean_up_tokenization_spaces,
        )
        values = (cls_token, sep_token, pad_token, mask_token, unk_token)
        tokens = dict(zip(_NAMES, values, strict=True))
        _check_special_tokens(tokenizer, tokens)
        _check_model_max_length(model_max_length)

        _set_bert_pipeline(
            tokenizer,
            model,
            unk_token=unk_token,
            do_lower_case=do_lower_case,
            strip_accents=strip_accents,
            tokenize_chinese_chars=tokenize_chinese_chars,
        )
        _add_tokens(tokenizer, added_tokens, [*tokens.values(), *additional_special_tokens])
        ids = _special_ids(tokenizer, tokens)
        tokenizer.post_processor = processors.BertProcessing(
            (sep_token, ids["sep_token"]), (cls_token, ids["cls_token"])
        )

        self._hf = tokenizer
        self._lock = threading.Lock()  # truncation is set on the shared pipeline per call
        self._tokens = tokens
        self._ids = ids
        self._additional = [t for t in additional_special_tokens if t not in tokens.values()]
        self._lower = do_lower_case
        self._strip = strip_accents
        self._chinese = tokenize_chinese_chars
        self._max_length = model_max_length
        self._clean_up = clean_up_tokenization_spaces

    # ----------------------------------------------------------------------------- properties

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (Hugging Face's ``len(tokenizer)``)."""
        return int(self._hf.get_vocab_size(with_added_tokens=True))

    def id_to_token(self, token_id: int) -> str | None:
        """The WordPiece string of an id (``"##ing"``, ``"[CLS]"``), or None."""
        return self._hf.id_to_token(token_id)

    @property
    def cls_id(self) -> int:
        """``[CLS]``'s id: the first token of every encoding."""
        return self._ids["cls_token"]

    @property
    def sep_id(self) -> int:
        """``[SEP]``'s id: after each text of an encoding."""
        return self._ids["sep_token"]

    @property
    def pad_id(self) -> int:
        """``[PAD]``'s id: what :meth:`encode_batch` pads with."""
        return self._ids["pad_token"]

    @property
    def mask_id(self) -> int:
        """``[MASK]``'s id (text that spells the mask token gets it)."""
        return self._ids["mask_token"]

    @property
    def unk_id(self) -> int:
        """``[UNK]``'s id: a word with no WordPiece spelling."""
        return self._ids["unk_token"]

    @property
    def special_tokens(self) -> dict[str, int]:
        """Every special token (matched in text, skipped when decoding) → id."""
        added = self._hf.get_added_tokens_decoder()
        return {t.content: i for i, t in sorted(added.items()) if t.special}

    @property
    def model_max_length(self) -> int | None:
        """The longest encoding when a call gives no ``max_length`` (None: no limit)."""
        return self._max_length

    @property
    def do_lower_case(self) -> bool:
        """Whether text is lowercased."""
        return self._lower

    @property
    def strip_accents(self) -> bool | None:
        """Whether accents are stripped (None: when lowercasing)."""
        return self._strip

    @property
    def tokenize_chinese_chars(self) -> bool:
        """Whether each CJK ideograph is a word of its own."""
        return self._chinese

    @property
    def clean_up_tokenization_spaces(self) -> bool:
        """Whether decoding applies Hugging Face's ``clean_up_tokenization``."""
        return self._clean_up

    # ----------------------------------------------------------------------------- coding

    def encode(
        self, text: str, pair: str | None = None, *, max_length: int | None = None
    ) -> Encoded:
        """``[CLS] text [SEP]`` or ``[CLS] text [SEP] pair [SEP]`` as ids and token type ids,
        truncated to ``max_length`` (default :attr:`model_max_length`) as Hugging Face's
        ``truncation=True`` does (``longest_first``: tokens come off the end of the longer
        text, one at a time). An empty ``pair`` is no pair, as in Hugging Face (in
        :meth:`encode_batch` it is an empty second text, as there too)."""
        return self._encode([text], [pair] if pair else None, max_length)[0]

    def encode_batch(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        max_length: int | None = None,
    ) -> BertBatch:
        """:meth:`encode` for many texts (with ``pairs``: one second text each), padded on the
        right into tensors (see :class:`BertBatch`)."""
        rows = self._encode(texts, pairs, max_length)
        width = max((len(r.ids) for r in rows), default=0)
        ids = [r.ids + [self.pad_id] * (width - len(r.ids)) for r in rows]
        types = [r.token_types + [0] * (width - len(r.ids)) for r in rows]
        mask = [[True] * len(r.ids) + [False] * (width - len(r.ids)) for r in rows]
        shape = (len(rows), width)  # (B, T): B rows of T values each, flattened in order
        return BertBatch(
            torch.tensor(ids, dtype=torch.long).reshape(shape),
            torch.tensor(types, dtype=torch.long).reshape(shape),
            torch.tensor(mask, dtype=torch.bool).reshape(shape),
        )

    def _encode(
        self, texts: Sequence[str], pairs: Sequence[str] | None, max_length: int | None
    ) -> list[Encoded]:
        if isinstance(texts, str) or isinstance(pairs, str):
            raise TypeError("texts and pairs must be sequences of strings, not one string")
        inputs: list[Any] = list(texts)
        if pairs is not None:
            second = list(pairs)
            if len(second) != len(inputs):
                raise UserError(f"{len(inputs)} texts but {len(second)} pairs")
            inputs = list(zip(inputs, second, strict=True))
        limit = self._limit(max_length, pair=pairs is not None)
        with self._lock:
            if limit is not None:
                self._hf.enable_truncation(limit, strategy="longest_first")
            try:
                encodings = self._hf.encode_batch(inputs, add_special_tokens=True)
            finally:
                self._hf.no_truncation()
        return [Encoded(list(e.ids), list(e.type_ids)) for e in encodings]

    def _limit(self, max_length: int | None, *, pair: bool) -> int | None:
        if max_length is None:
            return self._max_length
        needed = 3 if pair else 2
        if not is_int_at_least(max_length, needed):
            raise UserError(
                f"max_length must be an integer >= {needed} (the special tokens of "
                f"{'a pair' if pair else 'one text'}), got {max_length!r}"
            )
        return max_length

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of ``text``, no special tokens added."""
        return list(self._hf.encode(text, add_special_tokens=False).tokens)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (a list or a 1-D tensor), special tokens (padding too) skipped unless
        ``skip_special_tokens`` is False."""
        return self.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]

    def decode_batch(
        self, batch: Iterable[Iterable[int]], skip_special_tokens: bool = True
    ) -> list[str]:
        """:meth:`decode` for many id sequences (a list of lists or a 2-D tensor)."""
        rows = [_int_list(ids) for ids in _to_list(batch)]
        texts = self._hf.decode_batch(rows, skip_special_tokens=skip_special_tokens)
        return [_clean_up(t) for t in texts] if self._clean_up else list(texts)

    @overload
    def convert_ids_to_tokens(self, ids: int) -> str: ...

    @overload
    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]: ...

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        """The token string of an id, or of each id (special tokens included)."""
        if isinstance(ids, int):
            return self._id_to_token(ids)
        return [self._id_to_token(i) for i in _int_list(ids)]

    def _id_to_token(self, token_id: int) -> str:
        token = self._hf.id_to_token(token_id) if token_id >= 0 else None
        if token is None:
            raise UserError(f"id {token_id} is not in the vocabulary (0..{self.vocab_size - 1})")
        return str(token)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token string (a WordPiece piece or an added token), or None."""
        token_id = self._hf.token_to_id(token)
        return None if token_id is None else int(token_id)

    # ----------------------------------------------------------------------------- saving

    def save(self, folder: str | Path) -> None:
        """Write ``tokenizer.json`` (the whole pipeline) and the manifest ``bert_tokenizer.json``
        into ``folder`` (created), a JSON object::

            {"format": "aiayn-bert-tokenizer", "version": 1, "files": ["tokenizer.json"],
             "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
             "mask_token": "[MASK]", "unk_token": "[UNK]", "additional_special_tokens": [],
             "cls_id": 101, "sep_id": 102, "pad_id": 0, "mask_id": 103, "unk_id": 100,
             "vocab_size": 30522, "do_lower_case": true, "strip_accents": null,
             "tokenize_chinese_chars": true, "model_max_length": 512,
             "clean_up_tokenization_spaces": false}

        The manifest is written last, so a folder that has one is complete.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        with self._lock:
            text = self._hf.to_str(pretty=False)
        _write_bytes(folder / TOKENIZER_JSON, text.encode("utf-8"))
        manifest: dict[str, object] = {"format": _FORMAT, "version": _VERSION}
        manifest["files"] = [TOKENIZER_JSON]
        manifest.update(self._tokens)
        manifest["additional_special_tokens"] = list(self._additional)
        for key in ("cls_id", "sep_id", "pad_id", "mask_id", "unk_id", "vocab_size"):
            manifest[key] = getattr(self, key)
        manifest.update(self._settings())
        _write_bytes(folder / MANIFEST, _json_bytes(manifest))

    def _settings(self) -> dict[str, Any]:
        return {
            "do_lower_case": self._lower,
            "strip_accents": self._strip,
            "tokenize_chinese_chars": self._chinese,
            "model_max_length": self._max_length,
            "clean_up_tokenization_spaces": self._clean_up,
        }

    def __getstate__(self) -> dict[str, Any]:  # picklable (DataLoader workers): no lock
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"BertTokenizer(vocab_size={self.vocab_size}, do_lower_case={self._lower}, "
            f"model_max_length={self._max_length})"
        )


# -- BertTokenizer's set-up ----------------------------------------------------------------------
def _check_flags(
    *,
    do_lower_case: object,
    strip_accents: object,
    tokenize_chinese_chars: object,
    clean_up_tokenization_spaces: object,
) -> None:
    """Refuse a setting that is not a bool (``strip_accents``: a bool or None)."""
    for name, value in (
        ("do_lower_case", do_lower_case),
        ("tokenize_chinese_chars", tokenize_chinese_chars),
        ("clean_up_tokenization_spaces", clean_up_tokenization_spaces),
    ):
        if not isinstance(value, bool):
            raise UserError(f"{name} must be true or false, got {value!r}")
    if strip_accents is not None and not isinstance(strip_accents, bool):
        raise UserError(f"strip_accents must be true, false or null, got {strip_accents!r}")


def _check_special_tokens(tokenizer: _HFTokenizer, tokens: Mapping[str, str]) -> None:
    """Refuse a special token (name -> string) that is empty, not a string, or not in the
    vocabulary."""
    for name, token in tokens.items():
        if not isinstance(token, str) or not token:
            raise UserError(f"{name} must be a non-empty string, got {token!r}")
    missing = [t for t in tokens.values() if tokenizer.token_to_id(t) is None]
    if missing:
        raise UserError(f"special token {missing[0]!r} is not in the vocabulary")


def _check_model_max_length(model_max_length: object) -> None:
    """Refuse a ``model_max_length`` that is neither None nor an integer >= 3."""
    if model_max_length is not None and not is_int_at_least(model_max_length, 3):
        raise UserError(
            f"model_max_length must be an integer >= 3 or null, got {model_max_length!r}"
        )


def _set_bert_pipeline(
    tokenizer: _HFTokenizer,
    model: models.WordPiece,
    *,
    unk_token: str,
    do_lower_case: bool,
    strip_accents: bool | None,
    tokenize_chinese_chars: bool,
) -> None:
    """transformers' BERT pipeline, whatever a tokenizer.json says: WordPiece limits,
    ``BertNormalizer``, ``BertPreTokenizer``, the WordPiece decoder; no padding or truncation."""
    model.unk_token = unk_token
    model.continuing_subword_prefix = _PREFIX
    model.max_input_chars_per_word = _MAX_WORD_CHARS
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=tokenize_chinese_chars,
        strip_accents=strip_accents,
        lowercase=do_lower_case,
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix=_PREFIX)
    tokenizer.no_padding()
    tokenizer.no_truncation()


def _add_tokens(
    tokenizer: _HFTokenizer, added_tokens: Sequence[AddedToken], special: Sequence[str]
) -> None:
    """Add ``added_tokens`` (in order, with their flags) and then the ``special`` strings as
    special tokens, each unless the tokenizer already has it."""
    present = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    for added in added_tokens:
        if added.content not in present:
            present.add(added.content)
            if added.special:
                tokenizer.add_special_tokens([added])
            else:
                tokenizer.add_tokens([added])
    specials = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    for token_str in special:
        if token_str not in specials:
            specials.add(token_str)
            tokenizer.add_special_tokens([AddedToken(token_str, special=True, normalized=False)])


def _special_ids(tokenizer: _HFTokenizer, tokens: Mapping[str, str]) -> dict[str, int]:
    """The id of each special token, by name (each is in the vocabulary: checked before)."""
    ids: dict[str, int] = {}
    for name, token in tokens.items():
        token_id = tokenizer.token_to_id(token)
        assert token_id is not None  # checked by _check_special_tokens
        ids[name] = int(token_id)
    return ids


def _to_list(values: Any) -> Any:
    """A tensor or array as nested lists; anything else as it is."""
    return values.tolist() if hasattr(values, "tolist") else values


def _int_list(ids: Iterable[int]) -> list[int]:
    return [int(i) for i in _to_list(ids)]


# ----------------------------------------------------------------------------------- folders


def bert_tokenizer_from_hf(
    folder: str | Path, *, max_positions: int | None = None
) -> BertTokenizer | None:
    """The BERT tokenizer of a Hugging Face model folder, or None when it has neither
    ``tokenizer.json`` nor ``vocab.txt`` (``tokenizer.json`` is read where both are).

    The special tokens, ``do_lower_case``, ``strip_accents``, ``tokenize_chinese_chars``,
    ``model_max_length``, ``clean_up_tokenization_spaces`` and added tokens come from
    ``tokenizer_config.json`` and ``special_tokens_map.json`` as ``transformers`` reads them;
    ``model_max_length`` is capped by ``max_positions`` or, when that is None,
    ``config.json``'s ``max_position_embeddings``.

    Raises:
        UserError: naming a file that is there but unreadable (bad JSON, not a WordPiece
            vocabulary, a vocabulary without its special tokens, a bad setting).
    """
    folder = Path(folder)
    path = folder / TOKENIZER_JSON
    if path.is_file():
        tokenizer = _load_tokenizer_json(path)
    elif (folder / VOCAB_TXT).is_file():
        path = folder / VOCAB_TXT
        tokenizer = _read_vocab_txt(path)
    else:
        return None
    settings = _hf_settings(folder, max_positions)
    return _build(path, lambda: BertTokenizer(tokenizer, **settings))


def _read_vocab_txt(path: Path) -> _HFTokenizer:
    """A WordPiece pipeline on ``vocab.txt`` (read as ``transformers`` reads it, by
    ``tokenizers``: one token a line, line ends trimmed); the rest is set by BertTokenizer."""
    try:
        vocab = models.WordPiece.read_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise UserError(f"{path}: not a readable WordPiece vocabulary ({exc})") from None
    if not vocab:
        raise UserError(f"{path}: empty vocabulary")
    return _HFTokenizer(
        models.WordPiece(
            vocab,
            unk_token=_DEFAULT_TOKENS["unk_token"],
            max_input_chars_per_word=_MAX_WORD_CHARS,
            continuing_subword_prefix=_PREFIX,
        )
    )


def _hf_settings(folder: Path, max_positions: int | None) -> dict[str, Any]:
    """BertTokenizer's keyword arguments from a Hugging Face folder's JSON files."""
    config_path = folder / TOKENIZER_CONFIG
    config = _read_json_object(config_path, missing_ok=True)
    special_map = _read_json_object(folder / SPECIAL_TOKENS_MAP, missing_ok=True)
    model_config = _read_json_object(folder / MODEL_CONFIG, missing_ok=True)
    settings: dict[str, Any] = {}

    def bad(key: str, value: object, what: str) -> UserError:
        return UserError(f"{config_path}: {key} must be {what}, got {value!r}")

    for key, default in (("do_lower_case", True), ("tokenize_chinese_chars", True)):
        value = config.get(key, default)
        if not isinstance(value, bool):
            raise bad(key, value, "true or false")
        settings[key] = value
    strip = config.get("strip_accents")
    if strip is not None and not isinstance(strip, bool):
        raise bad("strip_accents", strip, "true, false or null")
    settings["strip_accents"] = strip
    settings["clean_up_tokenization_spaces"] = config.get("clean_up_tokenization_spaces") is True

    # Special tokens: tokenizer_config.json; special_tokens_map.json overrides it where the
    # config has no added_tokens_decoder (transformers' legacy rule).
    sources: list[Mapping[str, Any]] = [config]
    if "added_tokens_decoder" not in config:
        sources.append(special_map)
    for source in sources:
        for name in _NAMES:
            token = _token(source.get(name))
            if token:
                settings[name] = token
    settings["additional_special_tokens"] = _additional_special_tokens(sources)
    settings["added_tokens"] = _added_tokens(config.get("added_tokens_decoder"))

    limit = config.get("model_max_length", config.get("max_len"))
    if isinstance(limit, float) and limit.is_integer():
        limit = int(limit)
    if limit is not None and not is_int_at_least(limit, 3):
        raise bad("model_max_length", limit, "an integer >= 3")
    if limit is not None and limit > _LARGE:
        limit = None
    if max_positions is None:
        positions = model_config.get("max_position_embeddings")
        if isinstance(positions, int) and not isinstance(positions, bool) and positions >= 3:
            max_positions = positions
    if max_positions is not None:
        limit = max_positions if limit is None else min(limit, max_positions)
    settings["model_max_length"] = limit
    return settings


def _added_tokens(decoder: object) -> list[AddedToken]:
    """``added_tokens_decoder`` ({"id": {"content": ..., flags}}) as AddedTokens in id order."""
    if not isinstance(decoder, Mapping):
        return []
    found: list[tuple[int, AddedToken]] = []
    for key, value in decoder.items():
        content = _token(value)
        if content is None or not str(key).isdigit():
            continue
        flags = value if isinstance(value, Mapping) else {}
        special = flags.get("special") is True
        found.append(
            (
                int(key),
                AddedToken(
                    content,
                    single_word=flags.get("single_word") is True,
                    lstrip=flags.get("lstrip") is True,
                    rstrip=flags.get("rstrip") is True,
                    normalized=bool(flags.get("normalized", not special)),
                    special=special,
                ),
            )
        )
    return [token for _, token in sorted(found, key=lambda item: item[0])]


def load_bert_tokenizer(folder: str | Path) -> BertTokenizer:
    """The BERT tokenizer an aiayn checkpoint folder holds, as :meth:`BertTokenizer.save` wrote
    it.

    Raises:
        UserError: no manifest, a manifest of another format, a missing or corrupt
            tokenizer.json, or ids that differ from the manifest's.
    """
    folder = Path(folder)
    path, manifest = _read_manifest(folder, MANIFEST, _FORMAT, _VERSION, "BERT tokenizer")
    try:
        files = [str(f) for f in manifest["files"]]
        if files != [TOKENIZER_JSON]:
            raise UserError(f"{path}: unknown files {files} (expected [{TOKENIZER_JSON!r}])")
        kwargs: dict[str, Any] = {name: str(manifest[name]) for name in _NAMES}
        kwargs["additional_special_tokens"] = [
            str(t) for t in manifest["additional_special_tokens"]
        ]
        for key in (
            "do_lower_case",
            "strip_accents",
            "tokenize_chinese_chars",
            "model_max_length",
            "clean_up_tokenization_spaces",
        ):
            kwargs[key] = manifest[key]
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UserError(f"{path}: malformed manifest ({exc!r})") from None
    tokenizer_path = folder / TOKENIZER_JSON
    hf = _load_tokenizer_json(tokenizer_path)
    tokenizer = _build(tokenizer_path, lambda: BertTokenizer(hf, **kwargs))
    keys = ("cls_id", "sep_id", "pad_id", "mask_id", "unk_id", "vocab_size")
    _check_manifest_ids(path, manifest, tokenizer, keys, TOKENIZER_JSON)
    return tokenizer
