"""A checkpoint's input processing: aiayn's own ``tokenizer.json``, a converted pretrained
model's tokenizer files (listed in a manifest: :mod:`aiayn.data.pretrained_tokenizer`,
:mod:`aiayn.data.bert_tokenizer`), or a ViT's image preprocessing
(``preprocessor_config.json``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from aiayn.data.bert_tokenizer import MANIFEST as BERT_MANIFEST
from aiayn.data.bert_tokenizer import BertTokenizer, load_bert_tokenizer
from aiayn.data.images import PREPROCESSOR_CONFIG, ImagePreprocessor
from aiayn.data.pretrained_tokenizer import (
    MANIFEST,
    PretrainedTokenizer,
    TranslationTokenizer,
    load_pretrained_tokenizer,
)
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError

TOKENIZER_FILE = "tokenizer.json"
"""aiayn's own vocabulary in a checkpoint folder (the joint BPE, or a language model's)."""

TokenizerSource = Path | PretrainedTokenizer | BertTokenizer | ImagePreprocessor
"""A checkpoint's input processing: a tokenizer file (saved as ``tokenizer.json``), a pretrained
model's tokenizer, which saves its own files with a manifest, or a ViT's image preprocessing
(``preprocessor_config.json``)."""


def write_tokenizer(folder: Path, tokenizer: TokenizerSource) -> None:
    """Save ``tokenizer`` into the checkpoint ``folder`` being written."""
    if isinstance(tokenizer, Path):
        shutil.copyfile(tokenizer, folder / TOKENIZER_FILE)  # a new file: the user's umask
    else:
        tokenizer.save(folder)


def checkpoint_tokenizer(folder: Path) -> TokenizerSource:
    """The vocabulary saved in a checkpoint folder: a pretrained tokenizer when the folder lists
    one (a converted T5 or Marian model), else its ``tokenizer.json``."""
    if (folder / MANIFEST).is_file():
        return load_pretrained_tokenizer(folder)
    if (folder / BERT_MANIFEST).is_file():
        return load_bert_tokenizer(folder)
    if (folder / PREPROCESSOR_CONFIG).is_file():
        return ImagePreprocessor.from_folder(folder)
    return folder / TOKENIZER_FILE


def checkpoint_bert_tokenizer(folder: Path) -> BertTokenizer:
    """The BERT vocabulary of a checkpoint folder; a :class:`UserError` when it has none."""
    tokenizer = checkpoint_tokenizer(folder)
    if not isinstance(tokenizer, BertTokenizer):
        raise UserError(f"{folder} has no BERT vocabulary (bert_tokenizer.json)")
    return tokenizer


def checkpoint_preprocessor(folder: Path) -> ImagePreprocessor:
    """The image preprocessing of a (ViT) checkpoint folder; a :class:`UserError` when it has
    none."""
    preprocessor = checkpoint_tokenizer(folder)
    if not isinstance(preprocessor, ImagePreprocessor):
        raise UserError(f"{folder} has no image preprocessing (preprocessor_config.json)")
    return preprocessor


def load_translation_tokenizer(folder: Path) -> TranslationTokenizer:
    """The tokenizer an encoder–decoder checkpoint translates with: the pretrained model's own,
    or aiayn's joint BPE vocabulary (:class:`~aiayn.data.tokenizer.Tokenizer`)."""
    source = checkpoint_tokenizer(folder)
    if isinstance(source, (BertTokenizer, ImagePreprocessor)):
        raise UserError(f"{folder} holds an encoder-only model's inputs: it does not translate")
    return Tokenizer.load(source) if isinstance(source, Path) else source
