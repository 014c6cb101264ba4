"""Int8 checkpoints: quantise -> save -> load gives the same outputs without quantising again,
state.json marks them and the weights are stored as int8 with their scales; loading an fp32
checkpoint with ``quantize="int8"`` equals quantising it after; code that needs fp32 weights
refuses them by name; an int8 layer's weight or scales edited (checksums recomputed) to another
dtype or shape, or to scales not finite and > 0, are refused as the checkpoint loads, naming
the tensor."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

import aiayn.layers.quantized as quantized_module
from aiayn.checkpoint import (
    CheckpointError,
    load_checkpoint,
    read_checksums,
    record_checksums,
    save_checkpoint,
    save_safetensors,
    verify_files,
)
from aiayn.checkpoint.quantized import int8_layer_shapes, int8_problem
from aiayn.cli.main import main
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
    with pytest.raises(CheckpointError, match=r"state\.json: unknown quantization 'int4'"):
        load_checkpoint(tmp_path / "q")


# -- an int8 checkpoint's tensors, checked as it loads (aiayn.checkpoint.quantized) -------------

CROSS = "decoder.layers.0.cross_attn.in_proj"  # (96, 32): [W^Q; W^K; W^V] of d_model 32


def _edit_weights(folder: Path, name: str, edit: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Replace tensor ``name`` of the checkpoint's weights by ``edit(it)`` and record the edit in
    ``SHA256SUMS`` (as an edit by hand would be: the checksums then pass)."""
    file = folder / "model.safetensors"
    with safe_open(str(file), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(file))
    tensors[name] = edit(tensors[name]).contiguous()
    save_safetensors(tensors, file, metadata)
    record_checksums(folder)
    verify_files(folder, read_checksums(folder), ["model.safetensors", "state.json"])


def _set_rows(rows: list[int], value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def edit(scales: torch.Tensor) -> torch.Tensor:
        scales = scales.clone()
        scales[rows] = value
        return scales

    return edit


@pytest.fixture
def int8_folder(tmp_path: Path) -> Path:
    """A quantised translation checkpoint (the paper's model, d_model 32): ``tmp_path/q``."""
    return save_checkpoint(tmp_path / "q", quantize_model(_models()[0]), {}, TOKENIZER)


BAD_TENSORS = {
    "a zero scale": (
        f"{CROSS}.scales", _set_rows([5], 0.0),
        f"{CROSS}.scales: 1 of 96 scales are not finite and > 0 (row 5: 0.0)",
    ),
    "NaN scales in the key rows": (
        f"{CROSS}.scales", _set_rows([40, 41, 90], float("nan")),
        f"{CROSS}.scales: 3 of 96 scales are not finite and > 0 (row 40: nan)",
    ),
    "every scale NaN": (
        f"{CROSS}.scales", _set_rows(list(range(96)), float("nan")),
        f"{CROSS}.scales: 96 of 96 scales are not finite and > 0 (row 0: nan)",
    ),
    "a negative scale": (
        f"{CROSS}.scales", _set_rows([70], -1.0),
        f"{CROSS}.scales: 1 of 96 scales are not finite and > 0 (row 70: -1.0)",
    ),
    "an infinite scale": (
        "output_proj.scales", _set_rows([3], float("inf")),
        "output_proj.scales: 1 of 270 scales are not finite and > 0 (row 3: inf)",
    ),
    "int32 scales": (
        f"{CROSS}.scales", lambda s: torch.ones_like(s, dtype=torch.int32),
        f"{CROSS}.scales: dtype int32 where an int8 layer's scales are float32",
    ),
    "float64 scales": (
        "encoder.layers.1.feed_forward.linear1.scales", lambda s: s.double(),
        "encoder.layers.1.feed_forward.linear1.scales: dtype float64 where an int8 layer's "
        "scales are float32",
    ),
    "scales of another shape": (
        f"{CROSS}.scales", lambda s: s[:, None],
        f"{CROSS}.scales: shape (96, 1) where the int8 layer needs (96,)",
    ),
    "too few scales": (
        f"{CROSS}.scales", lambda s: s[:95],
        f"{CROSS}.scales: shape (95,) where the int8 layer needs (96,)",
    ),
    "a float weight": (
        f"{CROSS}.weight", lambda w: w.float(),
        f"{CROSS}.weight: dtype float32 where an int8 layer's weight is int8",
    ),
    "a weight of another shape": (
        f"{CROSS}.weight", lambda w: w[:, :31],
        f"{CROSS}.weight: shape (96, 31) where the int8 layer needs (96, 32)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_TENSORS))
def test_a_bad_int8_tensor_is_refused_naming_it(case: str, int8_folder: Path) -> None:
    name, edit, message = BAD_TENSORS[case]
    _edit_weights(int8_folder, name, edit)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(int8_folder)
    text = str(refused.value)
    assert text == (
        f"{int8_folder / 'model.safetensors'}: {message}; quantise the fp32 checkpoint again "
        "(aiayn quantize)"
    )
    assert "\n" not in text


def test_every_stored_int8_tensor_is_checked(int8_folder: Path) -> None:
    model = load_checkpoint(int8_folder).model  # intact: it loads
    tensors = load_file(str(int8_folder / "model.safetensors"))
    layers = int8_layer_shapes(model)
    assert int8_problem(layers, tensors) is None
    scales = [name for name in tensors if name.endswith(".scales")]
    assert len(scales) == len(layers) == 21  # 2 + 2 layers' attention and FFN, output_proj
    for name in scales:
        for value in (0.0, float("nan"), float("-inf")):
            edited = {**tensors, name: _set_rows([0], value)(tensors[name])}
            problem = int8_problem(layers, edited)
            assert problem is not None and problem.startswith(f"{name}: 1 of "), problem
        weight = name.removesuffix(".scales") + ".weight"
        edited = {**tensors, weight: tensors[weight].to(torch.int16)}
        assert int8_problem(layers, edited) == (
            f"{weight}: dtype int16 where an int8 layer's weight is int8"
        )


def test_int8_problem_by_hand() -> None:
    layers = {"proj": (2, 3)}
    weight = torch.zeros(2, 3, dtype=torch.int8)
    good = {"proj.weight": weight, "proj.scales": torch.tensor([0.5, 1e-30])}
    assert int8_problem(layers, good) is None
    assert int8_problem(layers, {}) is None  # missing tensors: loading names them
    nan = {**good, "proj.scales": torch.tensor([0.5, float("nan")])}
    assert (
        int8_problem(layers, nan)
        == "proj.scales: 1 of 2 scales are not finite and > 0 (row 1: nan)"
    )
    both = {**good, "proj.scales": torch.tensor([0.0, -0.0])}
    assert (
        int8_problem(layers, both)
        == "proj.scales: 2 of 2 scales are not finite and > 0 (row 0: 0.0)"
    )
    assert int8_problem({}, nan) is None  # no int8 layer: nothing to check


@pytest.mark.parametrize(
    "case",
    ["a zero scale", "NaN scales in the key rows", "every scale NaN", "a negative scale",
     "an infinite scale", "int32 scales", "scales of another shape"],
)  # fmt: skip
def test_translate_refuses_a_bad_int8_tensor_in_one_line(
    case: str, int8_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name, edit, message = BAD_TENSORS[case]
    _edit_weights(int8_folder, name, edit)
    (tmp_path / "in.txt").write_text("a small dog\n")
    argv = ["translate", "--checkpoint", str(int8_folder), "--input", str(tmp_path / "in.txt")]
    capsys.readouterr()
    assert main([*argv, "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"aiayn translate: error: {int8_folder / 'model.safetensors'}: {message}; quantise the "
        "fp32 checkpoint again (aiayn quantize)\n"
    )
