"""The vocabulary of a pretrained model's text (GPT-2's byte-level BPE and the like), read from a
Hugging Face folder through Hugging Face ``tokenizers``.

A folder gives its vocabulary as ``tokenizer.json`` or, for GPT-2-style models, as
``vocab.json`` + ``merges.txt`` (a byte-level BPE: ``decode(encode(s)) == s``). Whatever the
source, :class:`TextTokenizer` adds no special tokens when encoding (a model's own BOS/EOS ids
live in its config) and skips them when decoding, and it saves as one ``tokenizer.json``, which
is what an aiayn checkpoint folder holds. aiayn's own trained vocabulary
(:class:`~aiayn.data.tokenizer.Tokenizer`) is such a file too, so this class reads every
checkpoint's tokenizer.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError

TOKENIZER_JSON = "tokenizer.json"
GPT2_VOCAB, GPT2_MERGES = "vocab.json", "merges.txt"
GPT2_SPECIALS = ("<|endoftext|>",)


class TextTokenizer:
    """A Hugging Face ``tokenizers`` vocabulary: encode without specials, decode without them.

    Build one with :meth:`load` (a folder or a tokenizer.json file).
    """

    def __init__(self, hf_tokenizer: _HFTokenizer) -> None:
        self._hf = hf_tokenizer

    @classmethod
    def load(cls, path: str | Path) -> TextTokenizer:
        """From a ``tokenizer.json`` file, or a folder holding one or ``vocab.json`` +
        ``merges.txt`` (byte-level BPE, GPT-2's ``<|endoftext|>`` as a special token).

        Raises:
            UserError: naming the path when nothing readable is there.
        """
        path = Path(path)
        file = path / TOKENIZER_JSON if path.is_dir() else path
        if file.is_file():
            try:
                hf = _HFTokenizer.from_str(file.read_text(encoding="utf-8"))
            except Exception as exc:  # OSError, bad UTF-8/JSON, or tokenizers' bare Exception
                raise UserError(f"{file}: not a valid tokenizer JSON file ({exc})") from None
            hf.no_padding()  # saved settings transformers applies only when a call asks
            hf.no_truncation()
            return cls(hf)
        vocab, merges = path / GPT2_VOCAB, path / GPT2_MERGES
        if path.is_dir() and vocab.is_file() and merges.is_file():
            return cls(_byte_level_bpe(vocab, merges))
        raise UserError(
            f"no tokenizer at {path} (expected {TOKENIZER_JSON}, or {GPT2_VOCAB} + {GPT2_MERGES})"
        )

    def save(self, path: str | Path) -> None:
        """Write the vocabulary as one ``tokenizer.json`` (atomically; parents created)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self._hf.to_str(pretty=False), encoding="utf-8")
        os.replace(tmp, path)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self._hf.get_vocab_size(with_added_tokens=True))

    def token_to_id(self, token: str) -> int | None:
        """The id of a token string, or None."""
        return self._hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The token string of an id, or None."""
        return self._hf.id_to_token(token_id)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``, no special tokens added."""
        return list(self._hf.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """:meth:`encode` for many texts."""
        return [list(e.ids) for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, special tokens skipped."""
        return str(self._hf.decode([int(i) for i in ids], skip_special_tokens=True))

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """:meth:`decode` for many id sequences."""
        return [self.decode(ids) for ids in batch]

    def __repr__(self) -> str:
        return f"TextTokenizer(vocab_size={self.vocab_size})"


def _byte_level_bpe(vocab: Path, merges: Path) -> _HFTokenizer:
    """GPT-2's tokenizer from its two files: byte-level pre-tokenisation (GPT-2's regex, no
    prefix space) and decoding, the vocabulary's ``<|endoftext|>`` registered as special."""
    try:
        hf = _HFTokenizer(models.BPE.from_file(str(vocab), str(merges)))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise UserError(f"{vocab.parent}: unreadable {GPT2_VOCAB}/{GPT2_MERGES} ({exc})") from None
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    specials = [t for t in GPT2_SPECIALS if hf.token_to_id(t) is not None]
    if specials:
        hf.add_special_tokens(specials)
    return hf


class LMTokenizer(Protocol):
    """What the language-model task needs of a vocabulary (aiayn's or a pretrained one)."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def save(self, path: str | Path) -> None: ...


def load_lm_tokenizer(path: str | Path) -> LMTokenizer:
    """The tokenizer of a checkpoint folder or tokenizer.json: aiayn's own vocabulary when the
    file is one (special ids fixed, text that spells a special token stays text), else any
    Hugging Face vocabulary (:class:`TextTokenizer`: a converted GPT-2's)."""
    file = Path(path) / TOKENIZER_JSON if Path(path).is_dir() else Path(path)
    try:
        return Tokenizer.load(file)
    except UserError:
        return TextTokenizer.load(path)
