"""The peer of benchmarks/train_multi30k.py (benchmarks/_peer_nmt.py) given aiayn's recipe: its
averaging follows aiayn's rule (the same points, the same snapshots), its norm placement has the
LayerNorms aiayn's has (equal parameter counts), its schedule is eq. (3) times the scale."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import _peer_nmt as peer
from aiayn.config import preset
from aiayn.models.transformer import Transformer
from aiayn.training.averaging import AveragingPlan, AveragingWindow
from aiayn.training.averaging import averaging_points as aiayn_points
from aiayn.training.averaging import averaging_steps as aiayn_steps
from aiayn.training.schedule import transformer_lr as aiayn_lr


def test_averaging_points_by_hand_and_as_aiayn() -> None:
    assert peer.averaging_points(900.0, 0.1, 3) == [840.0, 870.0, 900.0]  # every 30 s
    for budget, window, n in [(3600.0, 0.1, 5), (18.0, 0.1, 5), (600.0, 0.25, 4), (60.0, 1.0, 1)]:
        assert peer.averaging_points(budget, window, n) == aiayn_points(budget, window, n)
    with pytest.raises(ValueError):
        peer.averaging_points(60.0, 0.0, 5)


def test_snapshots_are_taken_where_aiayn_writes_its_averaging_checkpoints() -> None:
    # budget 100 s, window 0.1, n 5: points 92, 94, 96, 98 (and the end, 100)
    ends = [91.0, 93.0, 93.5, 97.0, 99.0, 99.5]  # the elapsed time after steps 1..6
    averaging = peer.Averaging(100.0, 0.1, 5)
    model = nn.Linear(1, 1, bias=False)
    plan = AveragingPlan.of(5, 0.1, budget=10**6, max_minutes=100 / 60)
    window = AveragingWindow(folder=None, plan=plan)  # type: ignore[arg-type]
    aiayn_steps = []
    for step, elapsed in enumerate(ends, start=1):
        with torch.no_grad():
            model.weight.fill_(float(step))
        if averaging.due(elapsed):
            averaging.take(step, model)
        if window.due(step, elapsed, window.time_due(elapsed)):
            aiayn_steps.append(step)
    averaging.take(6, model)  # the end of the budget
    assert aiayn_steps == [2, 4, 5]  # 93 passes 92; 97 passes 94 and 96; 99 passes 98
    assert averaging.steps() == [2, 4, 5, 6]
    averaged = averaging.average()
    assert averaged is not None
    assert averaged["weight"].item() == pytest.approx((2 + 4 + 5 + 6) / 4)


def test_the_last_n_snapshots_are_averaged_and_one_is_not_an_average() -> None:
    averaging = peer.Averaging(10.0, 0.5, 2)  # points 7.5 (and 10)
    model = nn.Linear(1, 1, bias=False)
    averaging.take(3, model)
    assert averaging.average() is None  # one snapshot: nothing averaged
    averaging.take(3, model)  # the same step again: not a second snapshot
    assert averaging.steps() == [3]
    for step in (4, 5):
        with torch.no_grad():
            model.weight.fill_(float(step))
        averaging.take(step, model)
    assert averaging.steps() == [4, 5]
    averaged = averaging.average()
    assert averaged is not None and averaged["weight"].item() == pytest.approx(4.5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_final_layer_norms_as_aiayn_has_them(norm_first: bool) -> None:
    c = preset("tiny", norm_first=norm_first)
    ours = Transformer(c)
    theirs = peer.TorchReference(
        peer.PeerConfig(
            vocab_size=c.vocab_size,
            d_model=c.d_model,
            num_heads=c.num_heads,
            num_encoder_layers=c.num_encoder_layers,
            num_decoder_layers=c.num_decoder_layers,
            d_ff=c.d_ff,
            norm_first=norm_first,
            final_norm=norm_first,  # aiayn: a final LayerNorm per stack exactly with pre-norm
        )
    )
    count = sum(p.numel() for p in ours.parameters())
    assert sum(p.numel() for p in theirs.parameters()) == count
    assert (theirs.transformer.encoder.norm is None) == (not norm_first)
    assert (theirs.transformer.decoder.norm is None) == (not norm_first)


def test_embeddings_shared_and_tied_as_asked() -> None:
    shared = peer.TorchReference(peer.PeerConfig(vocab_size=50, d_model=16, num_heads=2, d_ff=32))
    assert shared.output.weight is shared.embedding.weight is shared.tgt_embedding.weight
    apart = peer.TorchReference(
        peer.PeerConfig(vocab_size=50, d_model=16, num_heads=2, d_ff=32, share_embeddings=False)
    )
    assert apart.tgt_embedding.weight is not apart.embedding.weight
    assert apart.output.weight is apart.tgt_embedding.weight  # tied to the target side
    untied = peer.TorchReference(
        peer.PeerConfig(vocab_size=50, d_model=16, num_heads=2, d_ff=32, tie_output=False)
    )
    assert untied.output.weight is not untied.embedding.weight


def test_schedule_is_eq3_times_the_scale() -> None:
    # step 1000 = warm-up 1000, d_model 256: 256^-0.5 · 1000^-0.5 = 1 / (16 · √1000)
    assert peer.transformer_lr(1000, 256, 1000) == pytest.approx(1 / (16 * 1000**0.5))
    for step in (1, 500, 1000, 4000):
        assert peer.transformer_lr(step, 256, 1000, 1.5) == pytest.approx(
            aiayn_lr(step, 256, 1000, 1.5)
        )


def _tiny_run() -> tuple[peer.TorchReference, peer.Encoded]:
    """A tiny pre-norm peer (seeded) and three training pairs."""
    torch.manual_seed(0)
    model = peer.TorchReference(
        peer.PeerConfig(vocab_size=20, d_model=16, num_heads=2, d_ff=32, norm_first=True)
    )
    return model, peer.Encoded([[4, 5, 6], [7, 8], [9, 10, 11, 12]], [[5, 6], [8, 9, 10], [11]])


@pytest.mark.parametrize("average_last", [0, 5])
def test_a_timed_run_averages_only_when_asked(average_last: int) -> None:
    model, data = _tiny_run()
    settings = peer.TrainSettings(minutes=0.002, max_tokens=10, average_last=average_last)
    log = peer.train_for(model, data, settings, device=torch.device("cpu"))
    assert log.steps >= 1
    if average_last == 0:  # the paper's recipe: its last weights
        assert (log.averaged, log.averaged_steps) == (None, [])
    else:  # the end of the budget is always the window's last snapshot
        assert log.averaged_steps[-1] == log.steps
        assert len(log.averaged_steps) <= 5
        assert (log.averaged is None) == (len(log.averaged_steps) < 2)


def test_step_points_are_aiayns_averaging_steps() -> None:
    for budget, window, n in [(2000, 0.1, 5), (10, 0.1, 5), (4669, 0.1, 5), (3445, 0.25, 4)]:
        assert peer.averaging_steps(budget, window, n) == aiayn_steps(budget, window, n)


@pytest.mark.parametrize("average_last", [0, 3])
def test_a_step_budget_makes_its_steps_and_averages_where_aiayn_would(average_last: int) -> None:
    model, data = _tiny_run()
    settings = peer.TrainSettings(
        minutes=0.0, steps=30, max_tokens=10, average_last=average_last, average_window=0.2
    )
    log = peer.train_for(model, data, settings, device=torch.device("cpu"))
    assert log.steps == 30 and log.epochs >= 2  # minutes=0 would have stopped at once
    if average_last:
        assert log.averaged_steps == aiayn_steps(30, 0.2, 3) == [26, 28, 30]
    else:
        assert log.averaged is None


def test_token_packing_keeps_padded_size_within_the_budget() -> None:
    # needs (length + 1 for EOS) 3, 3, 5, 5, 10: [3, 3] -> 3 × 2 = 6 fits 10; adding 5 would
    # need 5 × 3 = 15
    need = [3, 3, 5, 5, 10]
    assert peer.pack_by_tokens(range(5), need, 10) == [[0, 1], [2, 3], [4]]
    assert peer.pack_by_tokens(range(5), need, 6) == [[0, 1], [2], [3], [4]]  # 10 alone, too long
    assert peer.pack_by_tokens(range(5), [2] * 5, 100) == [[0, 1, 2, 3, 4]]
    assert peer.pack_by_tokens([], [], 10) == []
    # the given order is kept, and the batch's largest need counts, wherever it stands
    assert peer.pack_by_tokens([4, 0, 2], need, 20) == [[4, 0], [2]]


class _Ids:
    def __init__(self, ids: list[int]):
        self.ids = ids


class _Tokens:
    """Texts are space-separated ids; decoding writes them back the same way."""

    def encode_batch(self, texts: list[str]) -> list[_Ids]:
        return [_Ids([int(t) for t in text.split()]) for text in texts]

    def decode_batch(self, rows: list[list[int]]) -> list[str]:
        return [" ".join(map(str, row)) for row in rows]


@pytest.mark.parametrize("beam_size", [1, 3])
def test_token_batches_translate_as_sentence_batches_do(beam_size: int) -> None:
    model, _ = _tiny_run()
    sources = [" ".join(str(4 + (i * 7 + j) % 16) for j in range(1 + i % 6)) for i in range(23)]

    def run(**batching: int) -> list[str]:
        return peer.translate(
            model, _Tokens(), sources, beam_size=beam_size, alpha=0.6, extra_len=6,
            device=torch.device("cpu"), **batching,
        )  # fmt: skip

    one_by_one = run(batch_sentences=1)
    assert run(batch_sentences=64) == one_by_one
    for budget in (8, 40, 4096):  # a sentence per batch at 8 // beam, all at 4096
        assert run(max_tokens=budget) == one_by_one
    assert any(one_by_one)  # something was decoded


def test_saved_weights_decode_as_the_model_did(tmp_path: Path) -> None:
    texts = ["a small dog runs .", "ein kleiner hund rennt .", "a big cat sleeps ."] * 4
    tokenizer = peer.train_bpe(texts, vocab_size=60, min_frequency=1)
    config = peer.PeerConfig(
        vocab_size=tokenizer.get_vocab_size(), d_model=16, num_heads=2, d_ff=32
    )
    torch.manual_seed(0)
    model, other = peer.TorchReference(config), peer.TorchReference(config)
    weights = {"last": model.state_dict(), "averaged": other.state_dict()}
    peer.save_weights(tmp_path, config, tokenizer, weights)
    cpu = torch.device("cpu")
    for label, original in (("last", model), ("averaged", other)):
        loaded, loaded_bpe = peer.load_weights(tmp_path, label, cpu)
        assert loaded.config == config
        state = loaded.state_dict()
        assert all(torch.equal(state[k], v) for k, v in original.state_dict().items())
        sources = ["a small cat runs .", "ein hund"]
        for beam in (1, 2):
            ours = peer.translate(
                loaded, loaded_bpe, sources, beam_size=beam, extra_len=5, device=cpu
            )
            theirs = peer.translate(
                original, tokenizer, sources, beam_size=beam, extra_len=5, device=cpu
            )
            assert ours == theirs
    with pytest.raises(ValueError, match="no 'best' weights"):
        peer.load_weights(tmp_path, "best", cpu)
