"""BERT's WordPiece tokenizer against Hugging Face ``transformers``, offline: a small WordPiece
vocabulary is trained on the shipped demo corpus, Hugging Face's ``BertTokenizer`` is built on it
(lowercased and cased, with and without accent stripping) and saved as Hugging Face folders (one
with ``tokenizer.json``, one with ``vocab.txt`` + ``tokenizer_config.json`` only), and aiayn's
:class:`BertTokenizer`, read from those folders, must give the same ids, token type ids,
attention masks and ``decode(ids, skip_special_tokens=True)``.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import BertWordPieceTokenizer, models
from tokenizers import Tokenizer as HFTokenizer

from aiayn.data import demo_corpus_path, read_parallel
from aiayn.data.bert_tokenizer import (
    MANIFEST,
    BertTokenizer,
    Encoded,
    bert_tokenizer_from_hf,
    load_bert_tokenizer,
)
from aiayn.errors import UserError

transformers = pytest.importorskip("transformers")

# Lines that put accented letters, CJK characters and brackets into the vocabulary (the demo
# corpus is English and German); "☃", "⚙", "∰" and the emoji stay unknown.
EXTRA_LINES = [
    "Café, naïve façade, Ångström, Zürich, São Paulo, crème brûlée",
    "CAFÉ NAÏVE ÅNGSTRÖM",
    "日本語のテキストと中文",
    "[brackets] (parens) #hash @at & 100% $5",
]
LONG = " ".join(src for src, _ in read_parallel(demo_corpus_path())[:300])
TRICKY = [
    "Hello world.",
    "Café, naïve façade, Ångström, Zürich",
    "CAFÉ NAÏVE ÅNGSTRÖM crème brûlée",
    "decomposed e\u0301 and a\u0308",
    "日本語のテキストと中文",
    "mixed日本語text",
    "emoji 😀👍🏽 🇩🇪 end",
    "!!!???...;;;,,,---",
    "multiple     spaces   here",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\r\nhere",
    "unknown ☃ ⚙ ∰ glyphs",
    "control\x00chars\x07here\ufffd",
    "digits 1234567890 3.14 1,000,000",
    "",
    " ",
    "Paris is the [MASK] of France.",
    "x[MASK]y [MASK][MASK] [mask] [ MASK ] [MASK",
    "[CLS] and [SEP] spelled out, [PAD] [UNK]",
    "I can't do it , he said . Isn't it ?",
    "a" * 120 + " is a word longer than 100 characters",
    "non\u00a0breaking\u2009thin\u3000ideographic",
    LONG,
]
PAIRS = [
    ("Is this a question?", "Yes, it is."),
    ("Café [MASK]", "naïve 日本"),
    ("", "only the second"),
    ("only the first", ""),
    (LONG, "a short second text"),
    ("a short first text", LONG),
    (LONG, LONG[::-1]),
]
# (do_lower_case, strip_accents): BERT's uncased and cased models, and both overrides
VARIANTS = [(True, None), (False, None), (False, True), (True, False)]


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def vocab_txt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~500-token cased WordPiece vocabulary (with [PAD] [UNK] [CLS] [SEP] [MASK] at 0..4)."""
    lines = [s for pair in read_parallel(demo_corpus_path())[::20] for s in pair]
    trainer = BertWordPieceTokenizer(lowercase=False, strip_accents=False)
    trainer.train_from_iterator([*lines, *EXTRA_LINES], vocab_size=500, show_progress=False)
    folder = tmp_path_factory.mktemp("wordpiece")
    trainer.save_model(str(folder))
    return folder / "vocab.txt"


def _vocab_folder(root: Path, vocab_txt: Path, lower: bool, strip: bool | None) -> Path:
    """A Hugging Face folder with vocab.txt and tokenizer_config.json only."""
    folder = root / f"vocab-{lower}-{strip}"
    folder.mkdir()
    shutil.copy(vocab_txt, folder / "vocab.txt")
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lower,
        "strip_accents": strip,
        "tokenize_chinese_chars": True,
        "model_max_length": 512,
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "mask_token": "[MASK]",
        "unk_token": "[UNK]",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def folders(
    tmp_path_factory: pytest.TempPathFactory, vocab_txt: Path
) -> dict[tuple[bool, bool | None], dict[str, Any]]:
    """Per variant: the vocab.txt folder, the tokenizer.json folder Hugging Face saved from it,
    and Hugging Face's tokenizer of each."""
    root = tmp_path_factory.mktemp("bert")
    out: dict[tuple[bool, bool | None], dict[str, Any]] = {}
    for lower, strip in VARIANTS:
        vocab_folder = _vocab_folder(root, vocab_txt, lower, strip)
        hf = transformers.BertTokenizerFast.from_pretrained(vocab_folder)
        json_folder = root / f"json-{lower}-{strip}"
        hf.save_pretrained(json_folder)
        (json_folder / "vocab.txt").unlink(missing_ok=True)  # transformers 4 writes one too
        out[lower, strip] = {
            "vocab": vocab_folder,
            "json": json_folder,
            "hf_vocab": hf,
            "hf_json": transformers.BertTokenizerFast.from_pretrained(json_folder),
        }
    return out


def _ours(folder: Path) -> BertTokenizer:
    tokenizer = bert_tokenizer_from_hf(folder)
    assert tokenizer is not None
    return tokenizer


def _assert_same(
    ours: BertTokenizer,
    hf: Any,
    texts: list[str],
    pairs: list[str] | None = None,
    max_length: int | None = None,
) -> None:
    """Same ids, type ids, masks and decoded text, one by one and as a padded batch."""
    for i, text in enumerate(texts):
        pair = None if pairs is None else pairs[i]
        ref = hf(text, pair, truncation=True, max_length=max_length)
        got = ours.encode(text, pair, max_length=max_length)
        context = (text[:60], None if pair is None else pair[:60])
        assert got == Encoded(ref["input_ids"], ref["token_type_ids"]), context
        assert ours.decode(got.ids) == hf.decode(ref["input_ids"], skip_special_tokens=True)
        assert ours.decode(got.ids, skip_special_tokens=False) == hf.decode(ref["input_ids"])
        assert ours.convert_ids_to_tokens(got.ids) == hf.convert_ids_to_tokens(ref["input_ids"])
    ref = hf(texts, pairs, padding=True, truncation=True, max_length=max_length)
    batch = ours.encode_batch(texts, pairs, max_length=max_length)
    assert batch.ids.dtype == torch.long and batch.token_types.dtype == torch.long
    assert batch.attention_mask.dtype == torch.bool
    assert batch.ids.tolist() == ref["input_ids"]
    assert batch.token_types.tolist() == ref["token_type_ids"]
    assert batch.attention_mask.tolist() == [
        [bool(m) for m in row] for row in ref["attention_mask"]
    ]
    assert ours.decode_batch(batch.ids) == hf.batch_decode(
        ref["input_ids"], skip_special_tokens=True
    )


# ----------------------------------------------------------------------------------- parity


@pytest.mark.parametrize("source", ["vocab", "json"])
@pytest.mark.parametrize(("lower", "strip"), VARIANTS)
def test_same_as_transformers(
    folders: dict[tuple[bool, bool | None], dict[str, Any]],
    source: str,
    lower: bool,
    strip: bool | None,
) -> None:
    entry = folders[lower, strip]
    hf, ours = entry[f"hf_{source}"], _ours(entry[source])
    assert (ours.do_lower_case, ours.strip_accents) == (lower, strip)
    assert ours.model_max_length == hf.model_max_length == 512
    assert ours.vocab_size == len(hf)
    assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id, ours.unk_id) == (
        hf.cls_token_id,
        hf.sep_token_id,
        hf.pad_token_id,
        hf.mask_token_id,
        hf.unk_token_id,
    )
    _assert_same(ours, hf, TRICKY)
    _assert_same(ours, hf, [a for a, _ in PAIRS], [b for _, b in PAIRS])
    for text in TRICKY:
        assert ours.tokenize(text) == hf.tokenize(text)


def test_accents_and_cjk(folders: dict[tuple[bool, bool | None], dict[str, Any]]) -> None:
    """The variants differ where they should: lowercasing, accents, one token per ideograph."""
    uncased = _ours(folders[True, None]["vocab"])
    cased = _ours(folders[False, None]["vocab"])
    cased_stripped = _ours(folders[False, True]["vocab"])
    lower_kept = _ours(folders[True, False]["vocab"])
    assert "é" not in "".join(uncased.tokenize("Café"))
    assert "".join(cased.tokenize("Café")).replace("##", "") == "Café"
    assert "".join(cased_stripped.tokenize("Café")).replace("##", "") == "Cafe"
    assert "".join(lower_kept.tokenize("Café")).replace("##", "") == "café"
    assert uncased.tokenize("日本語") == ["日", "本", "語"]
    assert uncased.tokenize("unknown ☃")[-1] == "[UNK]"


def test_mask_in_text(folders: dict[tuple[bool, bool | None], dict[str, Any]]) -> None:
    ours = _ours(folders[True, None]["vocab"])
    ids = ours.encode("Paris is the [MASK] of France.").ids
    assert ids.count(ours.mask_id) == 1
    assert ids[0] == ours.cls_id and ids[-1] == ours.sep_id
    assert ours.mask_id not in ours.encode("the [mask] lowercased").ids
    assert ours.decode(ids) == "paris is the of france."
    assert ours.special_tokens == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}


@pytest.mark.parametrize("max_length", [3, 5, 8, 13])
def test_truncation_longest_first(
    folders: dict[tuple[bool, bool | None], dict[str, Any]], max_length: int
) -> None:
    entry = folders[True, None]
    hf, ours = entry["hf_json"], _ours(entry["json"])
    first = ["one two three four five six", "a b", "a b c d", "the same length", "x", ""]
    second = ["a b", "one two three four five six", "e f g h", "the same width!", "", "y z"]
    _assert_same(ours, hf, first, second, max_length)
    _assert_same(ours, hf, first + second, None, max_length)
    for ids in ours.encode_batch(first, second, max_length=max_length).ids.tolist():
        assert len(ids) <= max_length
    assert len(ours.encode(LONG).ids) == 512  # model_max_length
    assert len(ours.encode(LONG, LONG, max_length=100).ids) == 100


def test_max_length_too_small(folders: dict[tuple[bool, bool | None], dict[str, Any]]) -> None:
    ours = _ours(folders[True, None]["vocab"])
    assert ours.encode("hello world", max_length=2).ids == [ours.cls_id, ours.sep_id]
    with pytest.raises(UserError, match="max_length"):
        ours.encode("hello world", max_length=1)
    with pytest.raises(UserError, match="max_length"):
        ours.encode("hello", "world", max_length=2)
    with pytest.raises(UserError, match="2 texts but 1 pairs"):
        ours.encode_batch(["a", "b"], ["c"])
    with pytest.raises(TypeError):
        ours.encode_batch("one string")  # type: ignore[arg-type]


def test_tokenizer_config_decides(
    tmp_path: Path, folders: dict[tuple[bool, bool | None], dict[str, Any]]
) -> None:
    """As transformers does, tokenizer_config.json's settings win over a tokenizer.json's
    normaliser, post-processor, decoder and WordPiece limits."""
    folder = tmp_path / "mixed"
    shutil.copytree(folders[False, None]["json"], folder)  # a cased tokenizer.json
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["do_lower_case"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    data["model"]["max_input_chars_per_word"] = 4
    data["post_processor"] = None
    data["decoder"] = None
    data["truncation"] = {"max_length": 4, "stride": 0, "strategy": "OnlyFirst"}
    data["truncation"].update(direction="Right")
    (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    hf, ours = transformers.BertTokenizerFast.from_pretrained(folder), _ours(folder)
    assert ours.do_lower_case
    _assert_same(ours, hf, TRICKY[:8])


def test_clean_up_tokenization_spaces(
    tmp_path: Path, folders: dict[tuple[bool, bool | None], dict[str, Any]]
) -> None:
    folder = tmp_path / "clean"
    shutil.copytree(folders[True, None]["vocab"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["clean_up_tokenization_spaces"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    hf, ours = transformers.BertTokenizerFast.from_pretrained(folder), _ours(folder)
    assert ours.clean_up_tokenization_spaces and hf.clean_up_tokenization_spaces
    texts = ["I can't do it , he said . Isn't it ?", "it ' s we ' re they ' ve", *TRICKY[:6]]
    _assert_same(ours, hf, texts)


def test_model_max_length_capped_by_positions(
    tmp_path: Path, folders: dict[tuple[bool, bool | None], dict[str, Any]]
) -> None:
    folder = tmp_path / "capped"
    shutil.copytree(folders[True, None]["json"], folder)
    assert _ours(folder).model_max_length == 512
    (folder / "config.json").write_text('{"max_position_embeddings": 16}', encoding="utf-8")
    ours = _ours(folder)
    assert ours.model_max_length == 16
    assert len(ours.encode(LONG).ids) == 16
    tokenizer = bert_tokenizer_from_hf(folder, max_positions=8)
    assert tokenizer is not None and tokenizer.model_max_length == 8
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["model_max_length"] = int(1e30)  # transformers' "no limit"
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "config.json").unlink()
    unlimited = _ours(folder)
    assert unlimited.model_max_length is None
    assert len(unlimited.encode(LONG).ids) > 512


# ----------------------------------------------------------------------------------- batches


def test_batch_layout(folders: dict[tuple[bool, bool | None], dict[str, Any]]) -> None:
    ours = _ours(folders[True, None]["vocab"])
    batch = ours.encode_batch(["a b c d e", "a"], ["x", "y z"])
    assert batch.ids.shape == batch.token_types.shape == batch.attention_mask.shape
    lengths = batch.attention_mask.sum(1).tolist()
    assert batch.ids[1, lengths[1] :].eq(ours.pad_id).all()
    assert batch.token_types[1, lengths[1] :].eq(0).all()
    assert batch.to("cpu").ids.equal(batch.ids)
    empty = ours.encode_batch([])
    assert empty.ids.shape == (0, 0) and empty.attention_mask.dtype == torch.bool
    assert ours.decode(torch.tensor(ours.encode("hello world").ids)) == "hello world"


# ----------------------------------------------------------------------------------- saving


def test_manifest_round_trip(
    tmp_path: Path, folders: dict[tuple[bool, bool | None], dict[str, Any]]
) -> None:
    original = _ours(folders[False, True]["vocab"])
    original.save(tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["format"] == "aiayn-bert-tokenizer"
    assert manifest["files"] == ["tokenizer.json"]
    assert (manifest["do_lower_case"], manifest["strip_accents"]) == (False, True)
    assert manifest["mask_token"] == "[MASK]" and manifest["mask_id"] == original.mask_id
    assert manifest["model_max_length"] == 512
    loaded = load_bert_tokenizer(tmp_path / "ckpt")
    for key in ("vocab_size", "cls_id", "sep_id", "pad_id", "mask_id", "unk_id"):
        assert getattr(loaded, key) == getattr(original, key)
    for key in ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "model_max_length"):
        assert getattr(loaded, key) == getattr(original, key)
    for texts, pairs in ((TRICKY, None), ([a for a, _ in PAIRS], [b for _, b in PAIRS])):
        a, b = original.encode_batch(texts, pairs), loaded.encode_batch(texts, pairs)
        assert all(x.equal(y) for x, y in zip(a, b, strict=True))
        assert original.decode_batch(a.ids) == loaded.decode_batch(b.ids)
    # the saved folder is a Hugging Face folder too (tokenizer.json, default settings)
    again = bert_tokenizer_from_hf(tmp_path / "ckpt")
    assert again is not None and again.vocab_size == original.vocab_size
    copy = pickle.loads(pickle.dumps(loaded))
    assert copy.encode("Café [MASK]", "x") == loaded.encode("Café [MASK]", "x")


def test_manifest_errors(
    tmp_path: Path, folders: dict[tuple[bool, bool | None], dict[str, Any]]
) -> None:
    with pytest.raises(UserError, match=MANIFEST):
        load_bert_tokenizer(tmp_path)
    folder = tmp_path / "ckpt"
    _ours(folders[True, None]["vocab"]).save(folder)
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    (folder / MANIFEST).write_text(json.dumps({**manifest, "mask_id": 7}), encoding="utf-8")
    with pytest.raises(UserError, match="mask_id"):
        load_bert_tokenizer(folder)
    (folder / MANIFEST).write_text(json.dumps({**manifest, "version": 99}), encoding="utf-8")
    with pytest.raises(UserError, match="not an aiayn BERT-tokenizer manifest"):
        load_bert_tokenizer(folder)
    del manifest["do_lower_case"]
    (folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(UserError, match="malformed manifest"):
        load_bert_tokenizer(folder)
    (folder / "tokenizer.json").write_text("{ not json", encoding="utf-8")
    with pytest.raises(UserError, match=r"tokenizer\.json"):
        load_bert_tokenizer(folder)


# ----------------------------------------------------------------------------------- folders


def test_no_vocabulary_is_none(tmp_path: Path) -> None:
    assert bert_tokenizer_from_hf(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": true}', encoding="utf-8")
    assert bert_tokenizer_from_hf(tmp_path) is None


def test_corrupt_files(tmp_path: Path, vocab_txt: Path) -> None:
    bad_json = tmp_path / "bad-json"
    bad_json.mkdir()
    (bad_json / "tokenizer.json").write_text("{ not json", encoding="utf-8")
    with pytest.raises(UserError, match=r"bad-json.tokenizer\.json"):
        bert_tokenizer_from_hf(bad_json)

    bpe = tmp_path / "bpe"
    bpe.mkdir()
    HFTokenizer(models.BPE()).save(str(bpe / "tokenizer.json"))
    with pytest.raises(UserError, match=r"tokenizer\.json: not a WordPiece vocabulary"):
        bert_tokenizer_from_hf(bpe)

    binary = tmp_path / "binary"
    binary.mkdir()
    (binary / "vocab.txt").write_bytes(b"\xff\xfe\x00[CLS]\n\x80\x81\n")
    with pytest.raises(UserError, match=r"vocab\.txt"):
        bert_tokenizer_from_hf(binary)

    no_mask = tmp_path / "no-mask"
    no_mask.mkdir()
    lines = vocab_txt.read_text(encoding="utf-8").splitlines()
    (no_mask / "vocab.txt").write_text(
        "\n".join(t for t in lines if t != "[MASK]") + "\n", encoding="utf-8"
    )
    with pytest.raises(UserError, match=r"vocab\.txt: special token '\[MASK\]'"):
        bert_tokenizer_from_hf(no_mask)

    bad_config = tmp_path / "bad-config"
    bad_config.mkdir()
    shutil.copy(vocab_txt, bad_config / "vocab.txt")
    (bad_config / "tokenizer_config.json").write_text("{", encoding="utf-8")
    with pytest.raises(UserError, match=r"tokenizer_config\.json"):
        bert_tokenizer_from_hf(bad_config)
    (bad_config / "tokenizer_config.json").write_text('{"do_lower_case": "yes"}', "utf-8")
    with pytest.raises(UserError, match=r"tokenizer_config\.json: do_lower_case"):
        bert_tokenizer_from_hf(bad_config)


def test_unknown_id(folders: dict[tuple[bool, bool | None], dict[str, Any]]) -> None:
    ours = _ours(folders[True, None]["vocab"])
    assert ours.convert_ids_to_tokens(ours.mask_id) == "[MASK]"
    with pytest.raises(UserError, match="not in the vocabulary"):
        ours.convert_ids_to_tokens([ours.vocab_size])
    assert ours.token_to_id("[CLS]") == ours.cls_id
    assert ours.token_to_id("no such token") is None


def test_added_tokens_decoder(
    tmp_path: Path, folders: dict[tuple[bool, bool | None], dict[str, Any]]
) -> None:
    """A transformers-4-style tokenizer_config.json: added_tokens_decoder with the specials, a
    new plain token and a new special one (which decoding skips)."""
    folder = tmp_path / "added"
    shutil.copytree(folders[True, None]["vocab"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    flags = {"lstrip": False, "rstrip": False, "single_word": False}
    decoder = {
        str(i): {"content": t, "normalized": False, "special": True, **flags}
        for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    }
    decoder["500"] = {"content": "newtok", "normalized": True, "special": False, **flags}
    decoder["501"] = {"content": "<special1>", "normalized": False, "special": True, **flags}
    config["added_tokens_decoder"] = decoder
    config["additional_special_tokens"] = ["<special1>"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    hf, ours = transformers.BertTokenizerFast.from_pretrained(folder), _ours(folder)
    assert ours.vocab_size == len(hf) == 502
    assert ours.special_tokens["<special1>"] == 501
    texts = ["a NEWTOK <special1> b", "newtok<special1>newtok", "<SPECIAL1> [MASK]", *TRICKY[:5]]
    _assert_same(ours, hf, texts)
    ours.save(tmp_path / "ckpt")
    loaded = load_bert_tokenizer(tmp_path / "ckpt")
    assert loaded.encode_batch(texts).ids.equal(ours.encode_batch(texts).ids)


def test_vocab_txt_alone(tmp_path: Path, vocab_txt: Path) -> None:
    """No tokenizer_config.json: Hugging Face's defaults (lowercase, no length limit)."""
    shutil.copy(vocab_txt, tmp_path / "vocab.txt")
    hf, ours = transformers.BertTokenizerFast.from_pretrained(tmp_path), _ours(tmp_path)
    assert ours.do_lower_case and ours.model_max_length is None
    _assert_same(ours, hf, TRICKY)
