"""T5 and Marian tokenizers against Hugging Face ``transformers``, offline: tiny SentencePiece
models are trained on the shipped demo corpus (conftest.py), Hugging Face's tokenizers are built
from them and saved as Hugging Face folders, and aiayn's tokenizers, read from those folders,
must give the same ids (Hugging Face's minus its final EOS) and the same
``decode(ids, skip_special_tokens=True)``.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aiayn.data import demo_corpus_path, read_parallel
from aiayn.data.pretrained_tokenizer import (
    MANIFEST,
    MarianTokenizer,
    T5Tokenizer,
    load_pretrained_tokenizer,
    pretrained_tokenizer_from_hf,
)
from aiayn.errors import UserError

transformers = pytest.importorskip("transformers")
# transformers.MarianTokenizer without sacremoses (whose normaliser transformers 5 does not use)
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

EXTRA_IDS = 10
MakeHFT5 = Callable[[Path, int], Any]  # the conftest's make_hf_t5_tokenizer
LONG = " ".join(src for src, _ in read_parallel(demo_corpus_path())[:300])
TRICKY = [
    "Hello world.",
    "Tom asked his teacher for advice.",
    "Café, naïve façade, Ærøskøbing, Zürich, São Paulo",
    "Grüße aus Köln – „schön“!",
    "日本語のテキストと中文",
    "emoji 😀👍🏽 🇩🇪 end",
    "!!!???...;;;,,,---",
    "multiple     spaces   here",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\r\nhere",
    "unknown ☃ ⚙ ∰ glyphs",
    "digits 1234567890 3.14 1,000,000",
    "",
    " ",
    "x</s>y",
    "a <pad> b",
    "<unk> literal",
    "</s></s>",
    "<extra_id_0> sentinel <extra_id_9>",
    "ﬁ ligature ½ ① ＡＢＣ",
    "non\u00a0breaking\u2009thin\u3000ideographic",
    "next\x85line",
    "decomposed e\u0301 and a\u0308",
    "I can't do it , he said . Isn't it ?",
    LONG,
]
MARIAN_TRICKY = [
    *TRICKY,
    ">>de<< Hello world.",
    ">>fr<<Bonjour",
    ">>xx<< unknown code",
    " >>de<< after a space",
    ">>de",
    ">>de<<",
    "x </s>>>de<< y",
    ">>a b<< c",
]


# ----------------------------------------------------------------------------------- T5


@pytest.fixture(scope="module")
def t5_folders(
    sentencepiece_models: dict[str, Path],
    make_hf_t5_tokenizer: MakeHFT5,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    """Hugging Face T5 folders: "spm" as on the Hub (spiece.model, tokenizer_config.json,
    config.json), "json" as transformers 5 saves one (tokenizer.json only)."""
    root = tmp_path_factory.mktemp("t5")
    hub = root / "hub"
    hub.mkdir()
    shutil.copy(sentencepiece_models["t5"], hub / "spiece.model")
    config = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    (hub / "tokenizer_config.json").write_text(json.dumps(config | {"extra_ids": EXTRA_IDS}))
    (hub / "config.json").write_text(json.dumps({"model_type": "t5", "decoder_start_token_id": 0}))
    saved = root / "saved"
    make_hf_t5_tokenizer(hub, EXTRA_IDS).save_pretrained(saved)
    assert not (saved / "spiece.model").exists()
    return {"spm": hub, "json": saved}


@pytest.fixture(scope="module", params=["spm", "json"])
def t5_pair(
    request: pytest.FixtureRequest, t5_folders: dict[str, Path], make_hf_t5_tokenizer: MakeHFT5
) -> tuple[T5Tokenizer, Any]:
    """(aiayn's, Hugging Face's) tokenizer, both read from one folder."""
    folder = t5_folders[request.param]
    ours = pretrained_tokenizer_from_hf(folder, "t5")
    assert isinstance(ours, T5Tokenizer)
    assert ("sentencepiece" if request.param == "spm" else "tokenizers") in repr(ours)
    hf = (
        make_hf_t5_tokenizer(folder, EXTRA_IDS)
        if request.param == "spm"
        else transformers.AutoTokenizer.from_pretrained(folder)
    )
    return ours, hf


def _hf_ids(hf: Any, texts: list[str]) -> list[list[int]]:
    """Hugging Face's ids of ``texts``, their final EOS removed."""
    rows = [hf(t)["input_ids"] for t in texts]
    assert all(row[-1] == hf.eos_token_id for row in rows)
    return [row[:-1] for row in rows]


def _random_ids(vocab_size: int, specials: list[int], count: int = 300) -> list[list[int]]:
    rng = random.Random(0)
    pool = list(range(vocab_size)) + specials * 20
    return [[rng.choice(pool) for _ in range(rng.randrange(0, 16))] for _ in range(count)]


def _check_parity(ours: Any, hf: Any, texts: list[str], targets: list[list[int]]) -> None:
    ids = ours.encode_batch(texts)
    for text, mine, theirs in zip(texts, ids, _hf_ids(hf, texts), strict=True):
        assert mine == theirs, f"ids differ for {text[:80]!r}"
    rows = ids + targets
    decoded = ours.decode_batch(rows)
    for row, text in zip(rows, decoded, strict=True):
        assert text == hf.decode(row, skip_special_tokens=True), f"decode differs for {row[:40]}"


def test_t5_matches_hugging_face(t5_pair: tuple[T5Tokenizer, Any]) -> None:
    ours, hf = t5_pair
    specials = [hf.pad_token_id, hf.eos_token_id, hf.unk_token_id, *hf.all_special_ids]
    _check_parity(ours, hf, TRICKY, _random_ids(len(hf), specials))
    assert ours.encode("x</s>y") == hf.encode("x</s>y", add_special_tokens=False)
    assert 1 in ours.encode("x</s>y")  # text that spells a special token is that token


def test_t5_special_ids(t5_pair: tuple[T5Tokenizer, Any]) -> None:
    ours, hf = t5_pair
    assert (ours.pad_id, ours.eos_id, ours.unk_id) == (0, 1, 2)
    assert (hf.pad_token_id, hf.eos_token_id, hf.unk_token_id) == (0, 1, 2)
    assert ours.vocab_size == len(hf) == 400 + EXTRA_IDS
    sentinels = [f"<extra_id_{k}>" for k in range(EXTRA_IDS)]
    assert [ours.special_tokens[s] for s in sentinels] == hf.convert_tokens_to_ids(sentinels)
    assert ours.special_tokens["<extra_id_0>"] == ours.vocab_size - 1
    assert ours.decode([5, ours.special_tokens["<extra_id_3>"], 6, ours.unk_id, ours.eos_id]) == (
        ours.decode([5, 6])
    )


def test_t5_bos_is_decoder_start(t5_folders: dict[str, Path], tmp_path: Path) -> None:
    t5 = pretrained_tokenizer_from_hf(t5_folders["spm"], "t5")
    assert t5 is not None and t5.bos_id == 0
    folder = tmp_path / "t5"
    shutil.copytree(t5_folders["spm"], folder)
    (folder / "config.json").write_text(json.dumps({"decoder_start_token_id": 5}))
    t5 = pretrained_tokenizer_from_hf(folder, "T5")
    assert t5 is not None and t5.bos_id == 5


def test_t5_clean_up_tokenization_spaces_as_configured(
    t5_folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "t5"
    shutil.copytree(t5_folders["json"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["clean_up_tokenization_spaces"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ours, hf = (
        pretrained_tokenizer_from_hf(folder, "t5"),
        transformers.AutoTokenizer.from_pretrained(folder),
    )
    assert ours is not None
    texts = ["I can't do it , he said . Isn't it ?", "you 're here ! we 've won ."]
    decoded = ours.decode_batch(ours.encode_batch(texts))
    assert decoded == [hf.decode(hf.encode(t), skip_special_tokens=True) for t in texts]
    assert decoded[0] != texts[0]  # the spaces before "," "." "?" are gone


# ----------------------------------------------------------------------------------- Marian


@pytest.fixture(scope="module")
def marian_folders(
    sentencepiece_models: dict[str, Path],
    make_marian_vocab: Callable[..., dict[str, int]],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    """Hugging Face Marian folders saved by ``MarianTokenizer.save_pretrained``: "joint" (one
    vocab.json, with >>de<< and >>fr<<) and "separate" (vocab.json + target_vocab.json)."""
    root = tmp_path_factory.mktemp("marian")
    models = sentencepiece_models
    src, tgt = str(models["source"]), str(models["target"])
    joint = make_marian_vocab(models["source"], models["target"], codes=(">>de<<", ">>fr<<"))
    (root / "joint.json").write_text(json.dumps(joint, ensure_ascii=False))
    (root / "src.json").write_text(json.dumps(make_marian_vocab(models["source"])))
    (root / "tgt.json").write_text(json.dumps(make_marian_vocab(models["target"])))
    tokenizers = {
        "joint": transformers.MarianTokenizer(src, tgt, str(root / "joint.json")),
        "separate": transformers.MarianTokenizer(
            src,
            tgt,
            str(root / "src.json"),
            target_vocab_file=str(root / "tgt.json"),
            separate_vocabs=True,
        ),
    }
    folders = {}
    for name, tokenizer in tokenizers.items():
        folders[name] = root / name
        tokenizer.save_pretrained(folders[name])
        config = {"model_type": "marian", "decoder_start_token_id": tokenizer.pad_token_id}
        (folders[name] / "config.json").write_text(json.dumps(config))
    return folders


@pytest.fixture(scope="module", params=["joint", "separate"])
def marian_pair(
    request: pytest.FixtureRequest, marian_folders: dict[str, Path]
) -> tuple[MarianTokenizer, Any]:
    folder = marian_folders[request.param]
    ours = pretrained_tokenizer_from_hf(folder, "marian")
    assert isinstance(ours, MarianTokenizer)
    assert ours.separate_vocabs == (request.param == "separate")
    return ours, transformers.MarianTokenizer.from_pretrained(folder)


def test_marian_matches_hugging_face(marian_pair: tuple[MarianTokenizer, Any]) -> None:
    ours, hf = marian_pair
    targets = [hf(text_target=t)["input_ids"] for t in TRICKY]
    specials = [hf.pad_token_id, hf.eos_token_id, hf.unk_token_id]
    _check_parity(ours, hf, MARIAN_TRICKY, targets + _random_ids(ours.target_vocab_size, specials))
    german = "Ich habe meinem Lehrer eine Frage gestellt."
    assert ours.decode(hf(text_target=german)["input_ids"]) == german


def test_marian_targets_match_hugging_face_text_target(
    marian_pair: tuple[MarianTokenizer, Any],
) -> None:
    """Target text is coded by target.spm and the target vocabulary, as ``tokenizer(
    text_target=...)`` codes it (without its EOS): what a fine-tuning run trains on."""
    ours, hf = marian_pair
    texts = [*MARIAN_TRICKY, "Ich habe meinem Lehrer eine Frage gestellt.", "Hallo </s> Welt"]
    got = ours.encode_target_batch(texts)
    assert got == [hf(text_target=t)["input_ids"][:-1] for t in texts]
    assert got != ours.encode_batch(texts)  # the target side has a model of its own


def test_marian_language_codes(marian_folders: dict[str, Path]) -> None:
    ours = pretrained_tokenizer_from_hf(marian_folders["joint"], "marian")
    assert isinstance(ours, MarianTokenizer)
    de, fr = ours.encode_batch([">>de<< Hello", ">>fr<<Hello"])
    assert (de[0], fr[0]) == (2, 3) and de[1:] == fr[1:]
    assert ours.encode(">>xx<< Hello")[0] == ours.unk_id  # a code not in the vocabulary
    assert 2 not in ours.encode("x >>de<< Hello")  # not at the start: ordinary text


def test_marian_special_ids(marian_pair: tuple[MarianTokenizer, Any]) -> None:
    ours, hf = marian_pair
    assert (ours.eos_id, ours.unk_id) == (0, 1) == (hf.eos_token_id, hf.unk_token_id)
    assert ours.pad_id == hf.pad_token_id == ours.vocab_size - 1 == ours.bos_id
    assert ours.vocab_size == hf.vocab_size


# ----------------------------------------------------------------------------------- saving


@pytest.fixture(params=["t5-spm", "t5-json", "marian-joint", "marian-separate"])
def hf_folder(
    request: pytest.FixtureRequest, t5_folders: dict[str, Path], marian_folders: dict[str, Path]
) -> tuple[str, Path]:
    kind, variant = request.param.split("-")
    return kind, (t5_folders if kind == "t5" else marian_folders)[variant]


def test_save_load_round_trip(hf_folder: tuple[str, Path], tmp_path: Path) -> None:
    kind, folder = hf_folder
    original = pretrained_tokenizer_from_hf(folder, kind)
    assert original is not None
    checkpoint = tmp_path / "checkpoint"
    original.save(checkpoint)
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    assert manifest["kind"] == kind
    assert sorted(p.name for p in checkpoint.iterdir()) == sorted([*manifest["files"], MANIFEST])
    for key in ("pad_id", "eos_id", "unk_id", "bos_id", "vocab_size"):
        assert manifest[key] == getattr(original, key)
    loaded = load_pretrained_tokenizer(checkpoint)
    assert type(loaded) is type(original)
    for key in ("pad_id", "eos_id", "unk_id", "bos_id", "vocab_size"):
        assert getattr(loaded, key) == getattr(original, key)
    texts = MARIAN_TRICKY if kind == "marian" else TRICKY
    ids = original.encode_batch(texts)
    assert loaded.encode_batch(texts) == ids
    rows = ids + _random_ids(original.vocab_size, [original.eos_id, original.unk_id], 100)
    assert loaded.decode_batch(rows) == original.decode_batch(rows)


def test_load_checks_the_manifest(t5_folders: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        load_pretrained_tokenizer(tmp_path)
    t5 = pretrained_tokenizer_from_hf(t5_folders["spm"], "t5")
    assert t5 is not None
    t5.save(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    (tmp_path / MANIFEST).write_text(json.dumps(manifest | {"eos_id": 7}))
    with pytest.raises(UserError, match="eos_id"):
        load_pretrained_tokenizer(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps(manifest | {"kind": "bart"}))
    with pytest.raises(UserError, match="bart"):
        load_pretrained_tokenizer(tmp_path)
    (tmp_path / MANIFEST).write_text("{")
    with pytest.raises(UserError, match=MANIFEST):
        load_pretrained_tokenizer(tmp_path)


# ----------------------------------------------------------------------------------- errors


def test_folder_without_files_gives_none(marian_folders: dict[str, Path], tmp_path: Path) -> None:
    assert pretrained_tokenizer_from_hf(tmp_path, "t5") is None
    assert pretrained_tokenizer_from_hf(tmp_path, "marian") is None
    assert pretrained_tokenizer_from_hf(marian_folders["joint"], "bart") is None
    folder = tmp_path / "separate"
    shutil.copytree(marian_folders["separate"], folder)
    (folder / "target_vocab.json").unlink()
    assert pretrained_tokenizer_from_hf(folder, "marian") is None


@pytest.mark.parametrize(
    ("kind", "variant", "name"),
    [
        ("t5", "spm", "spiece.model"),
        ("t5", "json", "tokenizer.json"),
        ("marian", "joint", "source.spm"),
        ("marian", "joint", "target.spm"),
        ("marian", "joint", "vocab.json"),
        ("marian", "separate", "target_vocab.json"),
        ("marian", "joint", "tokenizer_config.json"),
    ],
)
def test_corrupt_file_is_a_user_error(
    kind: str,
    variant: str,
    name: str,
    t5_folders: dict[str, Path],
    marian_folders: dict[str, Path],
    tmp_path: Path,
) -> None:
    folder = tmp_path / "hf"
    shutil.copytree((t5_folders if kind == "t5" else marian_folders)[variant], folder)
    (folder / name).write_bytes(b"\x00\x01 not a model \xff")
    with pytest.raises(UserError, match=name.replace(".", r"\.")):
        pretrained_tokenizer_from_hf(folder, kind)


def test_corrupt_checkpoint_file_is_a_user_error(
    t5_folders: dict[str, Path], tmp_path: Path
) -> None:
    t5 = pretrained_tokenizer_from_hf(t5_folders["spm"], "t5")
    assert t5 is not None
    t5.save(tmp_path)
    (tmp_path / "spiece.model").write_bytes(b"garbage")
    with pytest.raises(UserError, match=r"spiece\.model"):
        load_pretrained_tokenizer(tmp_path)


def test_marian_vocab_without_specials_is_a_user_error(
    marian_folders: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "hf"
    shutil.copytree(marian_folders["joint"], folder)
    vocab = json.loads((folder / "vocab.json").read_text())
    del vocab["<pad>"]
    (folder / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(UserError, match=r"vocab\.json.*<pad>"):
        pretrained_tokenizer_from_hf(folder, "marian")
