"""Int8 checkpoints: quantise -> save -> load gives the same outputs without quantising again,
state.json marks them and the weights are stored as int8 with their scales; loading an fp32
checkpoint with ``quantize="int8"`` equals quantising it after; code that needs fp32 weights
refuses them by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

import aiayn.layers.quantized as quantized_module
from aiayn.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from aiayn.config import preset
from aiayn.errors import UserError
from aiayn.inference.quantize import quantize_model
from aiayn.layers.quantized import QuantizedLinear
from aiayn.models import GPT2, GPT2Config, Transformer

TOKENIZER = Path(__file__).parent / "fixtures" / "format1_tied" / "tokenizer.json"
SRC = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
TGT = torch.tensor([[1, 10, 11], [1, 12, 13]])


def _models() -> list[nn.Module]:
    torch.manual_seed(0)
    mt = preset("tiny", vocab_size=270, d_model=32, d_ff=64, num_heads=4, max_len=16)
    gpt2 = GPT2Config(270, 16, 32, 4, 2, bos_id=1, eos_id=2, pad_id=0)
    return [Transformer(mt).eval(), GPT2(gpt2).eval()]


def _run(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(model, GPT2):
            return model.log_probs(model(TGT).hidden)
        return model(SRC, TGT)


@pytest.mark.parametrize("index", [0, 1], ids=["transformer", "gpt2"])
def test_a_quantised_checkpoint_round_trips_without_quantising_again(
    index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = quantize_model(_models()[index])
    want = _run(model)
    save_checkpoint(tmp_path / "q", model, {"step": 3}, TOKENIZER)
    state = json.loads((tmp_path / "q" / "state.json").read_text())
    assert state["quantization"] == "int8" and state["step"] == 3
    with safe_open(str(tmp_path / "q" / "model.safetensors"), "pt") as f:
        dtypes = {name: f.get_tensor(name).dtype for name in f.keys()}  # noqa: SIM118
    int8 = [name for name, dtype in dtypes.items() if dtype == torch.int8]
    assert int8 and all(name.removesuffix(".weight") + ".scales" in dtypes for name in int8)

    def no_quantising(*args: object) -> None:
        raise AssertionError("loading a quantised checkpoint quantised again")

    monkeypatch.setattr(quantized_module, "quantize_weight", no_quantising)
    loaded = load_checkpoint(tmp_path / "q", expect=nn.Module)
    assert loaded.quantization == "int8"
    assert isinstance(loaded.model.output_proj, QuantizedLinear)
    torch.testing.assert_close(_run(loaded.model), want, atol=0, rtol=0)
    again = load_checkpoint(tmp_path / "q", expect=nn.Module, quantize="int8")  # as it is
    torch.testing.assert_close(_run(again.model), want, atol=0, rtol=0)


def test_loading_fp32_with_quantize_equals_quantising_after(tmp_path: Path) -> None:
    model = _models()[0]
    save_checkpoint(tmp_path / "fp32", model, {}, TOKENIZER)
    loaded = load_checkpoint(tmp_path / "fp32", quantize="int8")
    assert loaded.quantization == "none"  # the folder's weights are fp32
    assert not any(p.requires_grad for p in loaded.model.parameters())
    want = _run(quantize_model(load_checkpoint(tmp_path / "fp32").model))
    torch.testing.assert_close(_run(loaded.model), want, atol=0, rtol=0)
    assert not torch.equal(_run(load_checkpoint(tmp_path / "fp32").model), want)


def test_fp32_only_uses_and_bad_modes_are_refused(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "q", quantize_model(_models()[0]), {}, TOKENIZER)
    with pytest.raises(
        UserError, match=r"q holds an int8-quantised model; averaging needs fp32 weights$"
    ):
        load_checkpoint(tmp_path / "q", fp32_for="averaging")
    with pytest.raises(UserError, match="quantize must be one of none, int8, got 'int4'"):
        load_checkpoint(tmp_path / "q", quantize="int4")
    save_checkpoint(tmp_path / "fp32", _models()[0], {}, TOKENIZER)
    assert load_checkpoint(tmp_path / "fp32", fp32_for="averaging").quantization == "none"


def test_an_unknown_quantisation_in_state_json_is_named(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "q", _models()[0], {"quantization": "int4"}, TOKENIZER)
    state = json.loads((tmp_path / "q" / "state.json").read_text())
    assert "quantization" not in state  # written from the model, not from what was passed
    (tmp_path / "q" / "SHA256SUMS").unlink()
    state.pop("checksums")
    (tmp_path / "q" / "state.json").write_text(json.dumps({**state, "quantization": "int4"}))
    with pytest.raises(CheckpointError, match="state.json: unknown quantization 'int4'"):
        load_checkpoint(tmp_path / "q")
