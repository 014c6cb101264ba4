"""The joint byte-level BPE: fixed special ids, exact round trips, save/load, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiayn.data import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID, Tokenizer
from aiayn.errors import UserError


def test_special_ids(small_tokenizer: Tokenizer) -> None:
    tok = small_tokenizer
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert [tok.id_to_token(i) for i in range(4)] == list(SPECIAL_TOKENS)
    assert SPECIAL_TOKENS == ("<pad>", "<s>", "</s>", "<unk>")


def test_vocab_size(small_tokenizer: Tokenizer) -> None:
    assert small_tokenizer.vocab_size == 600
    assert small_tokenizer.id_to_token(599) is not None
    assert small_tokenizer.id_to_token(600) is None


def test_round_trip_example(small_tokenizer: Tokenizer) -> None:
    text = "Hallo, Welt! Ünïcödé 🙂"
    ids = small_tokenizer.encode(text)
    assert small_tokenizer.decode(ids) == text
    assert all(i >= 4 for i in ids)  # no specials added, no unk


def test_learned_merges_are_used(small_tokenizer: Tokenizer) -> None:
    # 600 tokens = 4 specials + 256 bytes + 340 merges; "Tom" is frequent in Tatoeba
    assert len(small_tokenizer.encode("Tom")) == 1
    assert len(small_tokenizer.encode("Tom")) < len(b"Tom")


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=60))
def test_round_trip_any_unicode(small_tokenizer: Tokenizer, text: str) -> None:
    ids = small_tokenizer.encode(text)
    assert UNK_ID not in ids
    assert all(0 <= i < small_tokenizer.vocab_size for i in ids)
    assert small_tokenizer.decode(ids) == text


def test_text_spelling_a_special_token_is_ordinary_text(small_tokenizer: Tokenizer) -> None:
    text = "a <pad> b </s> <s><unk>"
    ids = small_tokenizer.encode(text)
    assert not set(ids) & {0, 1, 2, 3}
    assert small_tokenizer.decode(ids) == text


def test_decode_skips_specials(small_tokenizer: Tokenizer) -> None:
    ids = small_tokenizer.encode("Ich rannte.")
    padded = [BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]
    assert small_tokenizer.decode(padded) == "Ich rannte."


def test_batch_paths_match_single(small_tokenizer: Tokenizer) -> None:
    texts = ["Hi.", "", "Guten Morgen, Tom!", "  zwei  Leerzeichen\t"]
    batch = small_tokenizer.encode_batch(texts)
    assert batch == [small_tokenizer.encode(t) for t in texts]
    assert small_tokenizer.decode_batch(batch) == texts
    assert small_tokenizer.encode("") == []


def test_save_load_exact(small_tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "sub" / "vocab.json"
    small_tokenizer.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["vocab.json"]  # one file, no leftovers
    json.loads(path.read_text(encoding="utf-8"))  # it is JSON
    loaded = Tokenizer.load(path)
    assert loaded.vocab_size == small_tokenizer.vocab_size
    texts = ["Tom ist nicht hier.", "Where's the <pad> key? 🙂", "Ünïcödé\u00a0\u3000x"]
    assert loaded.encode_batch(texts) == small_tokenizer.encode_batch(texts)
    assert [loaded.encode(t) for t in texts] == [small_tokenizer.encode(t) for t in texts]
    assert loaded.decode_batch(loaded.encode_batch(texts)) == texts
    loaded.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == path.read_bytes()


def test_training_is_deterministic(demo_pairs: list[tuple[str, str]], tmp_path: Path) -> None:
    texts = [s for pair in demo_pairs[::97] for s in pair]
    Tokenizer.train(texts, vocab_size=500).save(tmp_path / "a.json")
    Tokenizer.train(iter(texts), vocab_size=500).save(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"not found: .*missing\.json"):
        Tokenizer.load(tmp_path / "missing.json")


@pytest.mark.parametrize(
    "content", ['{"version": "1.0", "mod', '{"hello": 1}', "\x00\x01 binary"], ids=str
)
def test_load_corrupt_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "corrupt.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=r"corrupt\.json"):
        Tokenizer.load(path)


def test_load_foreign_tokenizer_without_fixed_specials(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, trainers

    hf = HFTokenizer(models.BPE(unk_token="[UNK]"))
    hf.train_from_iterator(["a b c"], trainers.BpeTrainer(special_tokens=["[UNK]"]))
    path = tmp_path / "foreign.json"
    hf.save(str(path))
    with pytest.raises(UserError, match=r"foreign\.json.*'<pad>' must have id 0"):
        Tokenizer.load(path)


@pytest.mark.parametrize("vocab_size", [259, 0, 1.5])
def test_train_rejects_tiny_vocab(vocab_size: int) -> None:
    with pytest.raises(UserError, match="vocab_size"):
        Tokenizer.train(["a b"], vocab_size=vocab_size)


def test_a_checkpoints_tokenizer_loads_as_what_it_is(
    small_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """aiayn's own vocabulary loads as :class:`Tokenizer` (text that spells "<pad>" stays text,
    as in training); any other vocabulary as a pretrained model's :class:`TextTokenizer`."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    from aiayn.data.text_tokenizer import TextTokenizer, load_lm_tokenizer

    small_tokenizer.save(tmp_path / "tokenizer.json")
    ours = load_lm_tokenizer(tmp_path)
    assert isinstance(ours, Tokenizer) and PAD_ID not in ours.encode("a <pad> b")
    other = tmp_path / "other.json"
    other.write_text(HFTokenizer(models.BPE(vocab={"a": 0}, merges=[])).to_str())
    assert isinstance(load_lm_tokenizer(other), TextTokenizer)
