"""BERT training data (aiayn.data.bert_data): the trained WordPiece vocabulary round-trips as a
converted BERT's does, labelled files are read strictly, encoded examples equal the tokenizer's
own encodings, batches respect the token budget, and masked-LM batches are a pure function of
(seed, draw ids) with exactly the target count the trainer is told beforehand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.data.bert_data import (
    SPECIAL_TOKENS,
    ClassificationSet,
    EncoderBatchSampler,
    LabelledText,
    MaskedLMSet,
    encode_texts,
    label_ids,
    label_set,
    read_labelled,
    train_wordpiece,
)
from aiayn.data.bert_tokenizer import BertTokenizer, load_bert_tokenizer
from aiayn.data.masking import IGNORE_INDEX
from aiayn.errors import UserError

LINES = [
    "The cat sat on the mat.",
    "A dog slept on the log, happily.",
    "Café au lait is coffee with milk.",
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
] * 8


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizer:
    return train_wordpiece(LINES, 120, min_frequency=1, model_max_length=16)


def test_trained_wordpiece_has_the_specials_first_and_round_trips(
    tokenizer: BertTokenizer, tmp_path: Path
) -> None:
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id) == (0, 1, 2)
    assert (tokenizer.sep_id, tokenizer.mask_id) == (3, 4)
    assert tokenizer.vocab_size <= 120 and tokenizer.do_lower_case
    encoded = tokenizer.encode("The cat sat on the [MASK].")
    assert encoded.ids[0] == 2 and encoded.ids[-1] == 3 and 4 in encoded.ids
    assert tokenizer.decode(tokenizer.encode("Café au lait").ids) == "cafe au lait"
    assert len(tokenizer.encode(" ".join(LINES)).ids) == 16  # model_max_length
    tokenizer.save(tmp_path)  # as a checkpoint holds it
    again = load_bert_tokenizer(tmp_path)
    assert again.encode(LINES[3]) == tokenizer.encode(LINES[3])
    assert again.special_tokens == tokenizer.special_tokens
    cased = train_wordpiece(LINES, 120, min_frequency=1, lowercase=False)
    assert not cased.do_lower_case and "The" in cased.tokenize("The cat")


def test_labelled_files_are_read_strictly(tmp_path: Path) -> None:
    good = tmp_path / "good.tsv"
    good.write_text("pos\tgreat film\n\nneg\tdull\n pos \tfine\n", encoding="utf-8")
    examples = read_labelled(good)
    assert examples == [
        LabelledText("pos", "great film"),
        LabelledText("neg", "dull"),
        LabelledText("pos", "fine"),
    ]
    assert label_set(examples, good) == ("neg", "pos")
    assert label_ids(examples, ("neg", "pos"), good).tolist() == [1, 0, 1]
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("yes\ta\tb\nno\tc\td\n", encoding="utf-8")
    assert read_labelled(pairs)[1] == LabelledText("no", "c", "d")
    cases = {
        "no tab here\n": r"bad\.tsv:1: expected label<TAB>text",
        "a\tb\nx\ty\tz\tw\n": r"bad\.tsv:2: expected label<TAB>text",
        "\tno label\n": r"bad\.tsv:1: expected",
        "a\tb\nc\td\te\n": r"bad\.tsv:2: 2 text\(s\) after the label where the lines before have 1",
        "\n\n": r"no examples",
    }
    bad = tmp_path / "bad.tsv"
    for text, message in cases.items():
        bad.write_text(text, encoding="utf-8")
        with pytest.raises(UserError, match=message):
            read_labelled(bad)
    with pytest.raises(UserError, match="at least 2 labels"):
        label_set([LabelledText("a", "x")], bad)
    with pytest.raises(UserError, match=r"label 'maybe' is not among the training labels"):
        label_ids([LabelledText("maybe", "x")], ("neg", "pos"), bad)


def test_encoded_texts_equal_the_tokenizer_and_pad_with_a_mask(tokenizer: BertTokenizer) -> None:
    texts = ["the cat", "a dog slept on the log, happily, on the mat", "the"]
    encoded = encode_texts(tokenizer, texts, max_length=8)
    for i, text in enumerate(texts):
        row = encoded.ids[encoded.offsets[i] : encoded.offsets[i + 1]].tolist()
        assert row == tokenizer.encode(text, max_length=8).ids
    assert encoded.lengths.tolist() == [4, 8, 3] and encoded.full == 1  # "the", "cat": words
    ids, types, mask = encoded.padded(np.array([2, 0]), pad_id=0)
    assert ids.tolist() == [[*tokenizer.encode("the").ids, 0], tokenizer.encode("the cat").ids]
    assert mask.tolist() == [[True] * 3 + [False], [True] * 4] and not types.any()
    pairs = encode_texts(tokenizer, ["the cat", "paris"], ["a dog", ""], max_length=16)
    first = tokenizer.encode("the cat", "a dog")
    n = len(first.ids)
    assert pairs.ids[:n].tolist() == first.ids
    assert pairs.token_types[:n].tolist() == first.token_types and first.token_types[-1] == 1


def test_batches_respect_the_budget_and_draw_ids_name_the_epoch() -> None:
    lengths = np.random.default_rng(0).integers(2, 30, size=200)
    sampler = EncoderBatchSampler(lengths, 120, seed=3)
    for epoch in (0, 1):
        batches = sampler.batches(epoch)
        assert sorted(i for b in batches for i in b) == list(range(200))
        assert all(len(b) * lengths[b].max() <= 120 for b in batches)
    assert sampler.batches(1) == EncoderBatchSampler(lengths, 120, seed=3).batches(1)
    assert sampler.batches(1) != sampler.batches(2)
    draws = EncoderBatchSampler(lengths, 120, seed=3, draw_ids=True)
    assert draws.batches(0) == sampler.batches(0)
    assert draws.batches(2) == [[400 + i for i in b] for b in sampler.batches(2)]
    fixed = EncoderBatchSampler(lengths, 120, seed=0, shuffle=False)
    assert fixed.batches(0) == fixed.batches(5)
    assert 0.0 <= sampler.padding_fraction() < 0.2


def test_masked_lm_batches_are_a_function_of_seed_and_draw_ids(
    tokenizer: BertTokenizer,
) -> None:
    texts = encode_texts(tokenizer, [*LINES[:10], "[MASK] cat"], max_length=12)
    examples = MaskedLMSet(texts, tokenizer, seed=5)
    specials = list(tokenizer.special_tokens.values())
    n = len(examples)
    for draws in ([0, 1, 2, 10], [3 + n, 4 + n], [7 + 5 * n]):
        batch = examples.collate(draws)
        assert batch.num_tgt_tokens == examples.target_tokens(draws)
        assert int((batch.labels != IGNORE_INDEX).sum()) == batch.num_tgt_tokens
        targets = batch.labels != IGNORE_INDEX
        assert not torch.isin(batch.labels[targets], torch.tensor(specials)).any()
        assert (batch.labels[~batch.attention_mask] == IGNORE_INDEX).all()
        again = examples.collate(draws)
        assert torch.equal(batch.inputs, again.inputs) and torch.equal(batch.labels, again.labels)
    # another epoch (draw ids + N): the same examples, other targets; another seed: other too
    first, later = examples.collate(range(n)), examples.collate(range(n, 2 * n))
    assert first.num_tgt_tokens == later.num_tgt_tokens == examples.num_targets
    assert torch.equal((first.labels != IGNORE_INDEX).sum(1), (later.labels != IGNORE_INDEX).sum(1))
    assert not torch.equal(first.labels, later.labels)
    other = MaskedLMSet(texts, tokenizer, seed=6).collate(range(n))
    assert not torch.equal(first.labels, other.labels)
    assert examples.num_targets == sum(examples.target_tokens([i]) for i in range(n))
    # "[MASK] cat" has one candidate ("cat"): one target; the [MASK] text is special
    assert examples.target_tokens([10]) == 1


def test_fixed_masks_do_not_depend_on_the_batching(tokenizer: BertTokenizer) -> None:
    texts = encode_texts(tokenizer, LINES, max_length=12)
    valid = MaskedLMSet(texts, tokenizer, seed=0, fixed=True)
    whole = valid.collate(range(len(valid)))
    for i in (0, 7, 39):
        alone = valid.collate([i])
        width = alone.inputs.size(1)
        assert torch.equal(alone.inputs[0], whole.inputs[i, :width])
        assert torch.equal(alone.labels[0], whole.labels[i, :width])
    assert torch.equal(
        whole.labels,
        MaskedLMSet(texts, tokenizer, seed=0, fixed=True).collate(range(len(valid))).labels,
    )
    assert whole.num_tgt_tokens == valid.num_targets > 0


def test_classification_batches(tokenizer: BertTokenizer) -> None:
    texts = encode_texts(tokenizer, ["the cat", "paris is nice", "dog"], max_length=16)
    examples = ClassificationSet(texts, np.array([1, 0, 1]), tokenizer.pad_id)
    batch = examples.collate([2, 1])
    assert batch.labels.tolist() == [1, 0] and batch.num_tgt_tokens == 2
    assert batch.ids.shape == batch.attention_mask.shape == batch.token_types.shape
    assert examples.target_tokens(np.array([0, 1, 2])) == 3
    with pytest.raises(ValueError, match="3 texts but 2 labels"):
        ClassificationSet(texts, np.array([1, 0]), 0)
