"""The joint source–target subword vocabulary of §5.1 (byte-pair encoding).

The paper encodes WMT English–German "using byte-pair encoding, which has a shared
source-target vocabulary of about 37000 tokens". :class:`Tokenizer` is that: one BPE model
trained on the source and the target sentences together, built with Hugging Face ``tokenizers``.

It is a *byte-level* BPE (as in GPT-2): the base alphabet is the 256 byte values, so every
Unicode string encodes without an unknown token and decodes back to exactly itself
(``decode(encode(s)) == s``, spaces, tabs and emoji included). Text that happens to spell a
special token (``"<pad>"``, ``"</s>"``) is encoded as ordinary text, never as the special id.

Special tokens have fixed ids, the same in every vocabulary:

    ====  ==========  ==
    pad   ``<pad>``   0
    bos   ``<s>``     1
    eos   ``</s>``    2
    unk   ``<unk>``   3
    ====  ==========  ==

:meth:`Tokenizer.encode` adds no specials; :func:`aiayn.data.batching.collate` adds BOS/EOS.
A vocabulary is saved as one JSON file (Hugging Face's ``tokenizer.json`` format).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from aiayn.errors import UserError

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "SPECIAL_TOKENS", "UNK_ID", "Tokenizer"]

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")
"""Special tokens in id order: ``SPECIAL_TOKENS[PAD_ID] == "<pad>"`` and so on."""

_NUM_BYTES = 256
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + _NUM_BYTES
"""The smallest vocabulary: the special tokens plus the 256 byte symbols."""


def _new_hf_tokenizer() -> _HFTokenizer:
    """An untrained byte-level BPE pipeline (no normaliser: the text is taken as it is)."""
    hf = _HFTokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK_ID]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    return hf


class Tokenizer:
    """A joint source–target byte-level BPE vocabulary with fixed special ids.

    Build one with :meth:`train` or :meth:`load`; the constructor wraps an existing Hugging Face
    tokenizer and checks its special ids.
    """

    def __init__(self, hf_tokenizer: _HFTokenizer) -> None:
        for token_id, token in enumerate(SPECIAL_TOKENS):
            if hf_tokenizer.token_to_id(token) != token_id:
                raise UserError(
                    f"not an aiayn tokenizer: special token {token!r} must have id {token_id}, "
                    f"found {hf_tokenizer.token_to_id(token)}"
                )
        # Text that spells "<pad>" etc. is ordinary text. The flag is not saved in the JSON, so
        # it is set here, on every construction path.
        hf_tokenizer.encode_special_tokens = True
        self._hf = hf_tokenizer
        self._special_ids = frozenset(range(len(SPECIAL_TOKENS)))

    # ----------------------------------------------------------------------------- building

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2) -> Tokenizer:
        """Learn a BPE vocabulary from ``texts`` (pass source *and* target sentences).

        Training is deterministic: the same texts in the same order give the same vocabulary.

        Args:
            texts: sentences to learn merges from.
            vocab_size: the largest vocabulary size, specials and 256 byte symbols included
                (so at least 260); a small corpus may give fewer tokens.
            min_frequency: a pair must occur this often to be merged.
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise UserError(f"vocab_size must be an integer, got {vocab_size!r}")
        if vocab_size < MIN_VOCAB_SIZE:
            raise UserError(
                f"vocab_size must be at least {MIN_VOCAB_SIZE} (4 special tokens + 256 bytes), "
                f"got {vocab_size}"
            )
        if min_frequency < 1:
            raise UserError(f"min_frequency must be >= 1, got {min_frequency}")
        hf = _new_hf_tokenizer()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        hf.train_from_iterator(texts, trainer=trainer)
        return cls(hf)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load a vocabulary written by :meth:`save`.

        Raises:
            UserError: the file is missing, is not a tokenizer JSON, or lacks the fixed special ids.
        """
        path = Path(path)
        if not path.is_file():
            raise UserError(f"tokenizer file not found: {path}")
        try:
            hf = _HFTokenizer.from_str(path.read_text(encoding="utf-8"))
        except Exception as exc:  # OSError, bad UTF-8/JSON, or tokenizers' bare Exception
            raise UserError(f"{path}: not a valid tokenizer JSON file ({exc})") from exc
        try:
            return cls(hf)
        except UserError as exc:
            raise UserError(f"{path}: {exc}") from exc

    def save(self, path: str | Path) -> None:
        """Write the vocabulary to one JSON file (parent folders are created)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self._hf.to_str(pretty=False), encoding="utf-8")
        os.replace(tmp, path)  # never leave a half-written vocabulary behind

    # ----------------------------------------------------------------------------- properties

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included; valid ids are ``0 .. vocab_size - 1``."""
        return int(self._hf.get_vocab_size(with_added_tokens=True))

    @property
    def pad_id(self) -> int:
        """Padding id (0)."""
        return PAD_ID

    @property
    def bos_id(self) -> int:
        """Beginning-of-sentence id (1), the decoder's first input."""
        return BOS_ID

    @property
    def eos_id(self) -> int:
        """End-of-sentence id (2)."""
        return EOS_ID

    @property
    def unk_id(self) -> int:
        """Unknown-token id (3); byte-level BPE never produces it, it only reserves the id."""
        return UNK_ID

    def id_to_token(self, token_id: int) -> str | None:
        """The token string of an id (byte-level symbols, e.g. ``"Ġthe"``), or None."""
        return self._hf.id_to_token(token_id)

    # ----------------------------------------------------------------------------- coding

    def encode(self, text: str) -> list[int]:
        """Subword ids of ``text``, no BOS/EOS added."""
        return list(self._hf.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """:meth:`encode` for many texts at once (parallel, without offsets: the fast path)."""
        encodings = self._hf.encode_batch_fast(list(texts), add_special_tokens=False)
        return [list(e.ids) for e in encodings]

    def encode_target_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Target ids of ``texts``: the joint vocabulary codes both sides alike."""
        return self.encode_batch(texts)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; special ids are skipped wherever they are (cut at EOS first)."""
        return str(self._hf.decode(self._strip_specials(ids), skip_special_tokens=True))

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """:meth:`decode` for many id sequences."""
        stripped = [self._strip_specials(ids) for ids in batch]
        return list(self._hf.decode_batch(stripped, skip_special_tokens=True))

    def _strip_specials(self, ids: Iterable[int]) -> list[int]:
        specials = self._special_ids
        return [i for i in (int(x) for x in ids) if i not in specials]

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"
