"""Checkpoints record their model family and format: old checkpoints still load as the paper's
model, another family or a newer format is refused by name, and a GPT-2 round-trips."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from aiayn.checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint
from aiayn.errors import UserError
from aiayn.models import GPT2, GPT2Config, Transformer

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", ["format1_tied", "format1_untied_learned"])
@torch.no_grad()
def test_checkpoints_written_before_families_load_as_the_paper_model(name: str) -> None:
    """Written by commit 878c5a6 (before the blocks took their parts): same outputs now."""
    ckpt = load_checkpoint(FIXTURES / name)
    assert ckpt.family == "transformer" and isinstance(ckpt.model, Transformer)
    expected = json.loads((FIXTURES / name / "expected.json").read_text())
    got = ckpt.model(torch.tensor(expected["src"]), torch.tensor(expected["tgt"]))
    torch.testing.assert_close(got, torch.tensor(expected["log_probs"]), atol=1e-6, rtol=1e-6)
    if name == "format1_tied":
        m = ckpt.model
        assert m.output_proj.weight is m.decoder.embedder.embedding.weight


def _gpt2() -> GPT2:
    torch.manual_seed(0)
    return GPT2(
        GPT2Config(
            vocab_size=270,
            max_len=16,
            d_model=16,
            num_heads=2,
            num_layers=1,
            bos_id=1,
            eos_id=2,
            pad_id=0,
        )
    ).eval()


@torch.no_grad()
def test_a_gpt2_checkpoint_round_trips_and_records_its_family(tmp_path: Path) -> None:
    model = _gpt2()
    tokenizer = FIXTURES / "format1_tied" / "tokenizer.json"
    save_checkpoint(tmp_path / "ck", model, {"step": 1}, tokenizer)
    state = json.loads((tmp_path / "ck" / "state.json").read_text())
    assert state["family"] == "gpt2" and state["format_version"] == FORMAT_VERSION
    loaded = load_checkpoint(tmp_path / "ck", expect=GPT2)
    x = torch.randint(0, 270, (2, 5))
    torch.testing.assert_close(loaded.model(x).hidden, model(x).hidden, atol=0, rtol=0)
    assert loaded.model.output_proj.weight is loaded.model.embedder.embedding.weight
    assert isinstance(load_checkpoint(tmp_path / "ck", expect=nn.Module).model, GPT2)
    with pytest.raises(
        UserError, match=r"holds a gpt2 model; this needs a checkpoint of transformer$"
    ):
        load_checkpoint(tmp_path / "ck")  # the translation commands' default


def _edited(tmp_path: Path, **changes: object) -> Path:
    folder = tmp_path / "edited"
    shutil.copytree(FIXTURES / "format1_tied", folder)
    state = json.loads((folder / "state.json").read_text())
    (folder / "state.json").write_text(json.dumps({**state, **changes}))
    return folder


def test_an_unknown_family_or_a_newer_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown model family 'llama'"):
        load_checkpoint(_edited(tmp_path, family="llama"))
    shutil.rmtree(tmp_path / "edited")
    newer = _edited(tmp_path, family="transformer", format_version=FORMAT_VERSION + 1)
    with pytest.raises(UserError, match="newer than this aiayn reads"):
        load_checkpoint(newer)


def test_weights_of_another_model_are_refused_by_name(tmp_path: Path) -> None:
    folder = _edited(
        tmp_path,
        family="gpt2",
        format_version=FORMAT_VERSION,
        model_config=_gpt2().config.to_dict(),
    )
    with pytest.raises(UserError, match=r"no tensor 'embedder\.embedding\.weight'"):
        load_checkpoint(folder, expect=GPT2)
