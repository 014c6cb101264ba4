"""``aiayn export --to ct2``: CTranslate2's translations, generations and encodings of the exported
models against aiayn's own, on tiny models with every parameter drawn at random.

Families: the paper's model post-norm and pre-norm (aiayn's BPE), Marian (sinusoid halves,
SiLU, logits bias, decoding from the pad id; a real MarianTokenizer of SentencePiece models),
T5 v1.0 and v1.1 (relative position bias, RMSNorm, gated GELU; a SentencePiece T5Tokenizer with
sentinels, the embedding padded past the tokenizer), GPT-2 (aiayn's BPE) and BERT as an encoder.

Both sides decode with the same rules: no banned tokens, α = 0 (plain log-probability; CTranslate2
then stops a sentence once its best candidate has ended, which gives the same best hypothesis as
aiayn's Hugging Face-style search), a length limit of M tokens, EOS included. At float32 the
outputs are token-identical; an output that differs must be a near-tie, told by the score margin
at the step where it parts from aiayn's (greedy) or between the two hypotheses' log-probabilities
(beam). Each test prints its count (``pytest -s``); docs/export.md records them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sentencepiece as spm
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from aiayn.checkpoint import load_checkpoint, load_translation_tokenizer, save_checkpoint
from aiayn.cli.main import main
from aiayn.config import preset
from aiayn.data import Tokenizer, demo_corpus_path, read_parallel
from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.data.pretrained_tokenizer import MarianTokenizer, T5Tokenizer
from aiayn.decoding.beam import beam_search
from aiayn.decoding.generate import GenerateOptions, generate_ids
from aiayn.decoding.lm import decoder_only_step
from aiayn.decoding.translate import DecodeOptions, translate_ids
from aiayn.errors import UserError
from aiayn.models import Transformer
from aiayn.models.bert import BERT, bert_preset
from aiayn.models.gpt2 import GPT2, gpt2_preset
from aiayn.models.t5 import T5, t5_preset
from data_builders import data_conftest

ctranslate2 = pytest.importorskip("ctranslate2")

M = 10  # the length limit, EOS included
N = 24  # test inputs per model
TIE = 1e-3  # a log-probability margin below this is a near-tie for float32 arithmetic
SEQ2SEQ = ("paper post-norm", "paper pre-norm", "marian", "t5 v1.0", "t5 v1.1")


_data = data_conftest()
sentencepiece_models = _data.sentencepiece_models
make_marian_vocab = _data.make_marian_vocab


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _randomise(model: torch.nn.Module, seed: int, raise_: dict[int, float] | None = None) -> None:
    """Every parameter redrawn: norm gains N(1, 0.2), everything else N(0, 0.4); the logits of
    the ids of ``raise_`` raised by their values on average (:func:`_raise_logit`): EOS's, so
    that some outputs end before the limit and others at it."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = "norm" in name and name.endswith("weight")
            p.normal_(1.0 if norm else 0.0, 0.2 if norm else 0.4)
        for token, boost in (raise_ or {}).items():
            _raise_logit(model, token, boost)


@torch.no_grad()
def _raise_logit(model: Any, token: int, boost: float) -> None:
    """Move ``token``'s output row along the decoder's mean final state (as the output layer reads
    it), so that its logit rises by ``boost`` on average over random inputs."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 200, (8, 10), generator=g)
    tgt = torch.randint(4, 200, (8, 10), generator=g)
    mask = model.source_mask(src)
    hidden = model.decode(tgt, model.encoder(src, mask).memory, mask).hidden * model.output_scale
    mean = hidden.mean((0, 1))  # (D,)
    model.output_proj.weight[token] += boost * mean / mean.norm() ** 2


def _paper(root: Path, bpe: Path, norm_first: bool) -> Path:
    tokenizer = Tokenizer.load(bpe)
    config = preset(
        "tiny", vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, num_heads=4,
        max_len=64, norm_first=norm_first, dropout=0.0,
    )  # fmt: skip
    model = Transformer(config)
    _randomise(model, 1 + norm_first, {tokenizer.eos_id: 7.0 if norm_first else 3.0})
    return save_checkpoint(root / f"paper-{norm_first}", model, {}, bpe)


def _marian(root: Path, spm_models: dict[str, Path], make_vocab: Callable[..., Any]) -> Path:
    source, target = (
        spm.SentencePieceProcessor(model_file=str(spm_models[s])) for s in ("source", "target")
    )
    vocab = make_vocab(spm_models["source"], spm_models["target"])
    pad = vocab["<pad>"]
    tokenizer = MarianTokenizer(source, target, vocab, bos_id=pad)
    config = preset(
        "tiny", vocab_size=len(vocab), d_model=32, d_ff=64, num_heads=4, max_len=64,
        positional="sinusoidal-halves", activation="silu", output_bias=True, pad_id=pad,
        dropout=0.0,
    )  # fmt: skip
    model = Transformer(config)
    _randomise(model, 3, {tokenizer.eos_id: 10.0})
    return save_checkpoint(root / "marian", model, {}, tokenizer)


def _t5(root: Path, spm_models: dict[str, Path], version: str) -> Path:
    tokenizer = T5Tokenizer(spm.SentencePieceProcessor(model_file=str(spm_models["t5"])))
    # v1.1 with heads wider than D / H (H·d_kv = 64 > D = 32): CTranslate2's head_dim
    v11 = dict(activation="gelu_tanh", gated=True, tie_output=False, scale_output=False, d_kv=16)
    config = t5_preset(
        "t5-tiny", vocab_size=512, d_model=32, d_ff=48, num_heads=4, num_buckets=8,
        max_distance=12, dropout=0.0, **(v11 if version == "v1.1" else {"d_kv": 8}),
    )  # fmt: skip
    assert tokenizer.vocab_size == 500 < config.vocab_size  # ids 500 .. 511: no string
    model = T5(config)
    _randomise(model, 4, {tokenizer.eos_id: 3.0 if version == "v1.1" else 1.0})
    return save_checkpoint(root / f"t5-{version}", model, {}, tokenizer)


def _gpt2(root: Path, bpe: Path) -> Path:
    tokenizer = Tokenizer.load(bpe)
    config = gpt2_preset(
        "gpt2-tiny", vocab_size=tokenizer.vocab_size, max_len=64, d_model=32, num_heads=4,
        num_layers=2, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
        dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = GPT2(config)
    _randomise(model, 5)
    with torch.no_grad():
        model.output_proj.weight[tokenizer.eos_id] *= 1.5  # tied: the embedding row too
    return save_checkpoint(root / "gpt2", model, {}, bpe)


WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(75))]


def _bert(root: Path) -> Path:
    vocab = {w: i for i, w in enumerate(WORDS)}
    tokenizer = BertTokenizer(HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]")))
    config = bert_preset(
        "bert-tiny", vocab_size=len(WORDS), max_len=32, d_model=32, num_heads=4, num_layers=2,
        d_ff=64, head="classification", num_labels=3, dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = BERT(config)
    _randomise(model, 6)
    return save_checkpoint(root / "bert", model, {}, tokenizer)


@pytest.fixture(scope="module")
def checkpoints(
    tmp_path_factory: pytest.TempPathFactory,
    sentencepiece_models: dict[str, Path],
    make_marian_vocab: Callable[..., Any],
) -> dict[str, Path]:
    """A checkpoint per case, with its tokenizer."""
    root = tmp_path_factory.mktemp("ckpts")
    pairs = read_parallel(demo_corpus_path())[:300]
    Tokenizer.train([s for p in pairs for s in p], 300, min_frequency=1).save(root / "bpe.json")
    return {
        "paper post-norm": _paper(root, root / "bpe.json", False),
        "paper pre-norm": _paper(root, root / "bpe.json", True),
        "marian": _marian(root, sentencepiece_models, make_marian_vocab),
        "t5 v1.0": _t5(root, sentencepiece_models, "v1.0"),
        "t5 v1.1": _t5(root, sentencepiece_models, "v1.1"),
        "gpt2": _gpt2(root, root / "bpe.json"),
        "bert": _bert(root),
    }


def _export(checkpoint: Path, out: Path, *flags: str) -> tuple[int, str, str]:
    import contextlib
    import io

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["export", "--checkpoint", str(checkpoint), "--to", "ct2", str(out), *flags])
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def exported(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Each checkpoint exported by ``aiayn export --to ct2`` (float32), and what it printed."""
    root = tmp_path_factory.mktemp("ct2")
    folders = {name: root / name.replace(" ", "-") for name in checkpoints}
    return {
        name: (*_export(path, folders[name]), folders[name]) for name, path in checkpoints.items()
    }


def _vocabularies(folder: Path) -> tuple[list[str], list[str]]:
    """The exported (source, target) token strings, as CTranslate2 reads them."""
    for name in ("shared_vocabulary.json", "vocabulary.json"):
        if (folder / name).is_file():
            tokens = json.loads((folder / name).read_text(encoding="utf-8"))
            return tokens, tokens
    read = [
        json.loads((folder / f"{side}_vocabulary.json").read_text())
        for side in ("source", "target")
    ]
    return read[0], read[1]


def _sources(specials: set[int], size: int, seed: int) -> list[list[int]]:
    """N random inputs of 1..12 ids, none special."""
    g = torch.Generator().manual_seed(seed)
    ids = [i for i in range(size) if i not in specials]
    lengths = torch.randint(1, 13, (N,), generator=g).tolist()
    return [
        [ids[j] for j in torch.randint(0, len(ids), (n,), generator=g).tolist()] for n in lengths
    ]


# -- near-ties ----------------------------------------------------------------------------------


@torch.no_grad()
def _step_log_probs(model: Any, src: list[int], out: list[int], tokenizer: Any) -> torch.Tensor:
    """aiayn's teacher-forced (T, V) log-probabilities after BOS + ``out``: row t is the
    distribution of output token t."""
    source = torch.tensor([[*src, tokenizer.eos_id]])
    target = torch.tensor([[tokenizer.bos_id, *out]])
    return model(source, target)[0]  # (T + 1, V)


def _sequence_score(log_probs: torch.Tensor, out: list[int], eos: int) -> float:
    """log P(out) (+ EOS when the output ended before the limit)."""
    ids = out + ([eos] if len(out) < M else [])
    return float(sum(log_probs[t, i] for t, i in enumerate(ids)))


def _margin(
    model: Any, src: list[int], ours: list[int], theirs: list[int], tok: Any, beam: int
) -> float:
    """How far apart two outputs are for aiayn: greedy, the log-probability gap of the two tokens
    at the step where they part; beam, the gap between their log-probabilities."""
    if beam == 1:
        t = next(
            i
            for i, (a, b) in enumerate(
                zip([*ours, tok.eos_id], [*theirs, tok.eos_id], strict=False)
            )
            if a != b
        )
        row = _step_log_probs(model, src, ours[:t], tok)[t]
        a, b = ([*ours, tok.eos_id][t], [*theirs, tok.eos_id][t])
        return abs(float(row[a] - row[b]))
    ours_lp = _sequence_score(_step_log_probs(model, src, ours, tok), ours, tok.eos_id)
    theirs_lp = _sequence_score(_step_log_probs(model, src, theirs, tok), theirs, tok.eos_id)
    return abs(ours_lp - theirs_lp)


# -- encoder–decoders ---------------------------------------------------------------------------


@pytest.mark.parametrize("bans", [False, True])
@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("case", SEQ2SEQ)
def test_translations_are_token_identical(
    case: str, beam: int, bans: bool, checkpoints: dict[str, Path], exported: Any
) -> None:
    """No banned tokens; or the two tokens the unbanned outputs use most banned (as ``aiayn
    translate`` bans the pad and BOS ids), renormalised (Hugging Face's
    ``renormalize_logits``), as CTranslate2's ``suppress_sequences`` bans them."""
    code, _, err = exported[case][:3]
    assert code == 0, err
    folder = exported[case][3]
    loaded = load_checkpoint(checkpoints[case], expect=torch.nn.Module)
    tokenizer = load_translation_tokenizer(loaded.path)
    specials = {tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id}
    rows = _sources(specials, tokenizer.vocab_size, seed=len(case))
    banned: tuple[int, ...] = ()
    if bans:
        used = Counter(t for o in _translate(loaded.model, rows, tokenizer, beam, ()) for t in o)
        banned = tuple(t for t, _ in used.most_common(2))
    ours = _translate(loaded.model, rows, tokenizer, beam, banned)

    sources, targets = _vocabularies(folder)
    index = {t: i for i, t in enumerate(targets)}
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
    results = translator.translate_batch(
        [[sources[i] for i in row] for row in rows], beam_size=beam, length_penalty=0.0,
        max_decoding_length=M, min_decoding_length=0,
        suppress_sequences=[[targets[t]] for t in banned] or None,
    )  # fmt: skip
    theirs = [[index[t] for t in r.hypotheses[0]] for r in results]

    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    print(f"\n{case}, beam {beam}{', 2 banned' if bans else ''}: {same}/{N} token-identical")
    for src, a, b in zip(rows, ours, theirs, strict=True):
        if a != b:
            assert _margin(loaded.model, src, a, b, tokenizer, beam) < TIE, (src, a, b)
    if bans:
        assert not set(banned) & {t for o in ours for t in o}
    else:
        lengths = {len(o) for o in ours}
        assert min(lengths) < M - 1 and max(lengths) == M, "outputs end by EOS and at the limit"


def _translate(
    model: Any, rows: list[list[int]], tokenizer: Any, beam: int, banned: tuple[int, ...]
) -> list[list[int]]:
    """aiayn's best outputs with CTranslate2's rules at α = 0 (see the module docstring)."""
    options = DecodeOptions(
        beam_size=beam, alpha=0.0, length_penalty="hf", early_stopping=False, max_new_tokens=M,
        banned=banned, renormalize=bool(banned),
    )  # fmt: skip
    return [h[0].tokens for h in translate_ids(model, rows, tokenizer, options)]


def test_the_near_tie_check_tells_a_real_difference(checkpoints: dict[str, Path]) -> None:
    """The margin that excuses a difference is large for outputs that really differ."""
    loaded = load_checkpoint(checkpoints["paper post-norm"], expect=torch.nn.Module)
    tokenizer = load_translation_tokenizer(loaded.path)
    src = _sources({0, 1, 2, 3}, tokenizer.vocab_size, seed=1)[0]
    (best,) = _translate(loaded.model, [src], tokenizer, 1, ())
    other = [*best[:2], best[2] + 1 if best[2] + 1 < tokenizer.vocab_size else 4, *best[3:]]
    assert _margin(loaded.model, src, best, best[:2] + other[2:3], tokenizer, 1) > TIE
    assert _margin(loaded.model, src, best, other, tokenizer, 4) > TIE


# -- GPT-2 --------------------------------------------------------------------------------------


@pytest.mark.parametrize("beam", [1, 4])
def test_generations_are_token_identical(
    beam: int, checkpoints: dict[str, Path], exported: Any
) -> None:
    code, _, err, folder = exported["gpt2"]
    assert code == 0, err
    model = load_checkpoint(checkpoints["gpt2"], expect=torch.nn.Module).model
    c = model.config
    prompts = _sources({c.bos_id, c.eos_id, c.pad_id}, c.vocab_size, seed=7)
    if beam == 1:
        ours = [
            h[0].tokens for h in generate_ids(model, prompts, GenerateOptions(max_new_tokens=M))
        ]
    else:  # aiayn's Hugging Face-style beam rules, as CTranslate2's with α = 0
        ours = []
        for prompt in prompts:
            step, state = decoder_only_step(model, [prompt], max_new_tokens=M)
            hyps = beam_search(
                step, state, batch_size=1, beam_size=beam, bos_id=c.bos_id, eos_id=c.eos_id,
                max_len=M, alpha=0.0, length_penalty="hf", early_stopping=False,
            )  # fmt: skip
            ours.append(hyps[0][0].tokens)
    tokens, _ = _vocabularies(folder)
    index = {t: i for i, t in enumerate(tokens)}
    generator = ctranslate2.Generator(str(folder), device="cpu", intra_threads=1)
    theirs = []
    for prompt in prompts:  # one at a time: a batch would decode the longer prompts' ends
        (result,) = generator.generate_batch(
            [[tokens[i] for i in prompt]], max_length=M, min_length=0, beam_size=beam,
            length_penalty=0.0, include_prompt_in_result=False,
        )  # fmt: skip
        theirs.append([index[t] for t in result.sequences[0]])
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    print(f"\ngpt2, beam {beam}: {same}/{N} token-identical")
    assert same == N, [(a, b) for a, b in zip(ours, theirs, strict=True) if a != b]
    lengths = {len(o) for o in ours}
    assert min(lengths) < M - 1 and max(lengths) == M, "outputs end both by EOS and at the limit"


# -- BERT ---------------------------------------------------------------------------------------


def test_encoder_states_equal_aiayns(checkpoints: dict[str, Path], exported: Any) -> None:
    code, _, err, folder = exported["bert"]
    assert code == 0, err
    assert "classifier is not part of the export" in err  # said, not silently dropped
    model = load_checkpoint(checkpoints["bert"], expect=torch.nn.Module).model
    tokens, _ = _vocabularies(folder)
    assert tokens == WORDS
    rows = [[2, *r, 3] for r in _sources(set(range(5)), len(WORDS), seed=8)[:8]]
    types = [[0] * (len(r) // 2) + [1] * (len(r) - len(r) // 2) for r in rows]
    encoder = ctranslate2.Encoder(str(folder), device="cpu", intra_threads=1)
    result = encoder.forward_batch([[tokens[i] for i in r] for r in rows], token_type_ids=types)
    hidden, pooled = np.array(result.last_hidden_state), np.array(result.pooler_output)
    width = max(map(len, rows))
    ids, type_ids, mask = (torch.zeros(len(rows), width, dtype=torch.long) for _ in range(3))
    for r, (row, ty) in enumerate(zip(rows, types, strict=True)):
        ids[r, : len(row)], type_ids[r, : len(row)] = torch.tensor(row), torch.tensor(ty)
        mask[r, : len(row)] = 1
    with torch.no_grad():
        reference = model(ids, type_ids, mask)
    for r, row in enumerate(rows):
        n = len(row)
        np.testing.assert_allclose(hidden[r, :n], reference.hidden[r, :n].numpy(), atol=1e-4)
    np.testing.assert_allclose(pooled, reference.pooled.numpy(), atol=1e-4)
    error = max(float(np.abs(hidden[r, : len(row)] - reference.hidden[r, : len(row)].numpy()).max())
                for r, row in enumerate(rows))  # fmt: skip
    print(f"\nbert encoder: max |CTranslate2 - aiayn| = {error:.1e} (last hidden state)")


# -- quantised weights, the command, refusals ---------------------------------------------------


@pytest.mark.parametrize("quantization", ["int8", "int8_float32"])
def test_int8_exports_load_and_run(
    quantization: str, checkpoints: dict[str, Path], exported: Any, tmp_path: Path
) -> None:
    out = tmp_path / quantization
    code, stdout, err = _export(checkpoints["paper pre-norm"], out, "--quantization", quantization)
    assert code == 0, err
    assert f"CTranslate2 ({quantization})" in stdout
    float32 = exported["paper pre-norm"][3]
    assert (out / "model.bin").stat().st_size < 0.6 * (float32 / "model.bin").stat().st_size
    sources, targets = _vocabularies(out)
    translator = ctranslate2.Translator(str(out), device="cpu", compute_type=quantization)
    rows = _sources({0, 1, 2, 3}, len(sources), seed=9)
    results = translator.translate_batch(
        [[sources[i] for i in r] for r in rows], max_decoding_length=M
    )
    assert len(results) == N
    assert all(
        0 < len(r.hypotheses[0]) <= M and set(r.hypotheses[0]) <= set(targets) for r in results
    )


def test_the_folder_holds_the_model_its_vocabulary_and_the_tokenizer(exported: Any) -> None:
    code, stdout, _, folder = exported["t5 v1.0"]
    assert code == 0 and stdout.startswith("exported ") and "t5, CTranslate2 (float32)" in stdout
    names = {p.name for p in folder.iterdir()}
    assert {
        "model.bin",
        "config.json",
        "shared_vocabulary.json",
        "pretrained_tokenizer.json",
    } <= names
    tokens, _ = _vocabularies(folder)
    assert len(tokens) == 512 and tokens[500:] == [f"<unused_{i}>" for i in range(500, 512)]
    assert tokens[1] == "</s>" and tokens[499] == "<extra_id_0>"
    config = json.loads((folder / "config.json").read_text())
    assert config["add_source_eos"] and config["decoder_start_token"] == "<pad>"


def test_sinusoids_cover_ctranslate2s_default_length(exported: Any) -> None:
    """max_len is 64, CTranslate2 decodes up to 256 tokens by default: the computed table has
    1024 rows, as aiayn computes positions past max_len on demand."""
    folder = exported["paper post-norm"][3]
    sources, _ = _vocabularies(folder)
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=1)
    (result,) = translator.translate_batch([sources[10:15]], min_decoding_length=200)
    assert len(result.hypotheses[0]) >= 200


def test_an_existing_folder_is_never_replaced(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    code, _, err = _export(checkpoints["gpt2"], out)
    assert code == 2 and "exists: aiayn export never replaces anything" in err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_token_strings_fill_and_refuse() -> None:
    from aiayn.convert.to_ct2 import token_strings

    class Vocab:
        def __init__(self, tokens: list[str | None]) -> None:
            self.tokens = tokens

        def id_to_token(self, i: int) -> str | None:
            return self.tokens[i] if i < len(self.tokens) else None

    assert token_strings(Vocab(["a", None, "b"]), 4) == ["a", "<unused_1>", "b", "<unused_3>"]
    assert token_strings(Vocab(["<unused_1>", None]), 2) == ["<unused_1>", "<<unused_1>>"]
    with pytest.raises(UserError, match="spells two ids 'a'"):
        token_strings(Vocab(["a", "b", "a"]), 3)


def test_separate_vocabularies_read_each_side_and_must_spell_the_specials_alike() -> None:
    from types import SimpleNamespace

    from aiayn.convert.to_ct2 import _set_seq2seq_config, token_strings

    source, targets = ["</s>", "<unk>", "a", "<pad>"], ["</s>", "<unk>", "<pad>", "x"]
    tokenizer = SimpleNamespace(
        id_to_token=lambda i, target=False: (targets if target else source)[i],
        separate_vocabs=True, eos_id=0, unk_id=1, pad_id=3, bos_id=3,
    )  # fmt: skip
    assert token_strings(tokenizer, 4) == source
    assert token_strings(tokenizer, 4, target=True) == targets
    config = SimpleNamespace()
    with pytest.raises(UserError, match="spell bos_id 3 differently \\('<pad>', 'x'\\)"):
        _set_seq2seq_config(config, tokenizer, source, targets, 1e-5)
    tokenizer.bos_id = 0
    _set_seq2seq_config(config, tokenizer, source, targets, 1e-5)
    specials = (config.decoder_start_token, config.eos_token, config.unk_token)
    assert specials == ("</s>", "</s>", "<unk>")
    assert config.add_source_eos and config.layer_norm_epsilon == 1e-5


def test_parts_without_an_equivalent_are_refused_by_name() -> None:
    from aiayn.convert.to_ct2 import encoder_decoder_spec

    model = Transformer(preset("tiny", vocab_size=40, d_model=16, d_ff=32, num_heads=2))
    model.encoder.layers[0].ff_sublayer.norm = torch.nn.Identity()
    with pytest.raises(UserError, match="a Identity has no CTranslate2 equivalent"):
        encoder_decoder_spec(model)
    mixed = Transformer(preset("tiny", vocab_size=40, d_model=16, d_ff=32, num_heads=2))
    mixed.decoder.layers[1].self_sublayer.norm.eps = 1e-6
    with pytest.raises(UserError, match="several ε"):
        from aiayn.convert.to_ct2 import _norm_eps

        _norm_eps(mixed)
