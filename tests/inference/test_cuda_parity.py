"""aiayn on a GPU against aiayn on the CPU: every family's forward, the one attention function
under each of PyTorch's fused-attention backends, the searches and their key/value caches,
training steps and checkpoints, the CPU-only kernels' behaviour on a GPU, and the service.

Run on a machine with CUDA: ``python -m pytest tests/inference/test_cuda_parity.py``. Without
CUDA every test skips (CI has no GPU). ``AIAYN_TEST_DEVICE`` names the device under test
(default ``cuda``); ``AIAYN_TEST_DEVICE=cpu`` runs the same checks with the CPU standing in for
the device, to develop them on a machine without a GPU (the tests that check what the CPU-only
kernels do elsewhere then skip).

Where tokens must be equal the models run in float64 on both sides (random models have near-ties
that float32's summation order can flip); TF32 is off inside every test (the trainer turns it on
for CUDA: :func:`aiayn.performance.configure_device`) and restored after it. Families come from
the registry (:data:`aiayn.models.families.FAMILIES`), each given inputs by what it reads and
serves.

Shape legend:  B batch   S source / key length   T target / query length   H heads
    d head size   V vocabulary   C channels
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from aiayn.attention import CAUSAL, Mask, causal_mask, scaled_dot_product_attention
from aiayn.checkpoint import load_checkpoint, save_checkpoint
from aiayn.checkpoint.optimizer import read_optimizer_state
from aiayn.config import ModelConfig
from aiayn.decoding import (
    GenerateOptions,
    encoder_decoder_step,
    generate_ids,
    inference_step,
)
from aiayn.decoding.argmax import first_argmax
from aiayn.decoding.translate import DecodeOptions, translate_ids
from aiayn.inference.kernels import PackedLinear, packing_available
from aiayn.inference.packed import pack_for_inference
from aiayn.inference.quantize import quantize_model
from aiayn.layers.quantized import QuantizedLinear
from aiayn.layers.relative_position import relative_position_bucket
from aiayn.models.families import FAMILIES, Family, families_serving, resolve
from aiayn.models.gpt2 import GPT2
from aiayn.models.transformer import EncoderDecoder
from data_builders import load_test_file

DEVICE = torch.device(os.environ.get("AIAYN_TEST_DEVICE", "cuda"))
CPU = torch.device("cpu")
ON_CPU = DEVICE.type == "cpu"

pytestmark = pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(),
    reason="no CUDA device here (AIAYN_TEST_DEVICE=cpu runs these checks on the CPU)",
)

PAD, BOS, EOS = 0, 1, 2  # the encoder–decoders' specials in these tests (the configs' pad_id: 0)
FAMILY_IDS = list(FAMILIES)


@pytest.fixture(autouse=True)
def _no_tf32() -> Iterator[None]:
    """TF32 matmuls off for the test (fp32 on a GPU is then fp32), the settings restored after."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _close(got: Tensor, want: Tensor, rel: float, what: str) -> None:
    """``got`` (any device) within ``rel`` × max(1, max |want|) of ``want``, and finite."""
    got = got.detach().to(CPU, torch.float64)
    want = want.detach().to(CPU, torch.float64)
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert bool(torch.isfinite(got).all()), f"{what}: not finite on {DEVICE}"
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    error = float((got - want).abs().max()) if want.numel() else 0.0
    assert error <= rel * scale, f"{what}: max |device - cpu| = {error:.3g} > {rel:g} x {scale:.3g}"


def _tolerance(t: Tensor) -> float:
    """Relative tolerance of an output computed in ``t``'s dtype on two devices (summation order
    and the transcendental functions' last bits differ)."""
    return 1e-10 if t.dtype == torch.float64 else 2e-5


def _tensors(out: Any, name: str = "out") -> dict[str, Tensor]:
    """Every tensor in a model's output (named tuples, lists, key/value caches), by path."""
    if isinstance(out, Tensor):
        return {name: out}
    found: dict[str, Tensor] = {}
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        for field, value in zip(out._fields, out, strict=True):
            found.update(_tensors(value, f"{name}.{field}"))
    elif isinstance(out, (list, tuple)):
        for i, value in enumerate(out):
            found.update(_tensors(value, f"{name}[{i}]"))
    return found


# -- the families' tiny models and their inputs --------------------------------------------------


def _kind(family: Family) -> str:
    """What inputs a family's model takes, from what the registry says it reads and serves."""
    if family.reads == "image":
        return "image"
    for command in ("translate", "generate", "embed"):
        if family.supports(command):
            return command
    raise AssertionError(f"no test inputs for family {family.name}: add its kind to this file")


def _config(family: Family, **changes: Any) -> ModelConfig:
    """The family's smallest preset (by its closed-form parameter count), with ``changes``."""
    name = min(family.presets, key=lambda n: family.count(family.presets[n]))
    return family.presets.build(name, **changes)


def _random_model(family: Family, seed: int = 0, **changes: Any) -> nn.Module:
    """A tiny model of ``family`` on the CPU in eval mode, every parameter moved off its
    initialisation (norms not at 1, biases not at 0), in float64."""
    torch.manual_seed(seed)
    model = family.build(_config(family, **changes)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.double()


def _inputs(family: Family, config: Any, seed: int = 1) -> dict[str, Tensor]:
    """Inputs of one forward, with padding: a real row, a padded row and a row of padding only
    (text), or two images."""
    g = torch.Generator().manual_seed(seed)
    kind = _kind(family)
    if kind == "image":
        size = (2, config.num_channels, config.image_size, config.image_size)
        return {"pixels": torch.randn(size, generator=g, dtype=torch.float64)}
    tokens = torch.randint(3, config.vocab_size, (3, 7), generator=g)
    if kind == "translate":
        src = tokens.clone()
        src[1, 4:], src[2, :] = PAD, PAD  # a padded source and an empty one
        vocab = getattr(config, "target_vocab_size", config.vocab_size)
        tgt = torch.randint(3, vocab, (3, 5), generator=g)
        tgt[:, 0], tgt[1, 3:] = BOS, PAD  # teacher forcing from BOS; a padded target
        return {"src": src, "tgt": tgt}
    real = torch.ones(3, 7, dtype=torch.bool)
    if kind == "generate":
        real[1, :3], real[2, :] = False, False  # a left-padded prompt and one of padding only
        return {"tokens": tokens.masked_fill(~real, config.pad_id), "real": real}
    real[1, 4:], real[2, :] = False, False  # a right-padded sentence and one of padding only
    return {"tokens": tokens.masked_fill(~real, config.pad_id), "real": real}


def _forward(family: Family, model: nn.Module, x: dict[str, Tensor]) -> dict[str, Tensor]:
    """The model's forward on ``x`` (moved to the model's device): its output tensors by name."""
    device = next(model.parameters()).device
    x = {k: v.to(device, _dtype(model) if v.is_floating_point() else None) for k, v in x.items()}
    kind = _kind(family)
    if kind == "image":
        return _tensors(model(x["pixels"]))
    if kind == "translate":
        return _tensors(model(x["src"], x["tgt"]), "log_probs")
    if kind == "generate":
        out = model(x["tokens"], key_padding=x["real"])
        assert isinstance(model, GPT2)
        return {**_tensors(out), "log_probs": model.log_probs(out.hidden)}
    return _tensors(model(x["tokens"], attention_mask=x["real"]))


def _dtype(model: nn.Module) -> torch.dtype:
    """The floating dtype of the model's parameters."""
    return next(model.parameters()).dtype


@pytest.mark.parametrize("name", FAMILY_IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@torch.no_grad()
def test_every_family_forward_on_device_equals_cpu(name: str, dtype: torch.dtype) -> None:
    """The same weights and padded inputs: the device's outputs equal the CPU's in float64 (to
    its summation order), and in float32 the float64 CPU reference to float32's precision; no
    output is NaN, the rows of padding only included."""
    family = FAMILIES[name]
    cpu_model = _random_model(family)
    x = _inputs(family, cpu_model.config)
    want = _forward(family, cpu_model, x)
    got = _forward(family, copy.deepcopy(cpu_model).to(DEVICE, dtype), x)
    assert got.keys() == want.keys() and want
    for key, value in got.items():
        assert value.device.type == DEVICE.type, f"{key} came back on {value.device}"
        rel = _tolerance(value) if dtype == torch.float64 else 2e-4
        _close(value, want[key], rel, f"{name} {key}")


ENCODERS = [n for n, f in FAMILIES.items() if f.reads == "image" or f.supports("embed")]


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_fast_path_on_device_equals_cpu(name: str) -> None:
    """The registry's inference runner of an encoder family (the encoder on its real tokens,
    :mod:`aiayn.inference.encoder`) on the device gives the CPU's outputs in float64, at every
    real position (padded ones are zeros on both)."""
    family = FAMILIES[name]
    assert family.inference is not None
    runner_class = resolve(family.inference)
    cpu_model = _random_model(family)
    dev_model = copy.deepcopy(cpu_model).to(DEVICE)
    x = _inputs(family, cpu_model.config)
    outputs = []
    for model, device in ((cpu_model, CPU), (dev_model, DEVICE)):
        runner = runner_class(model)
        if _kind(family) == "image":
            out = runner(x["pixels"].to(device))
        else:
            out = runner(x["tokens"].to(device), None, x["real"].to(device))
        outputs.append(_tensors(out))
    want, got = outputs
    assert got.keys() == want.keys() and want
    for key, value in got.items():
        _close(value, want[key], _tolerance(value), f"{name} fast path {key}")


# -- attention ------------------------------------------------------------------------------------

BACKENDS = ["default", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]
"""PyTorch's fused-attention backends (``default``: its own choice, what aiayn runs)."""
DTYPE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _attention_case(case: str, g: torch.Generator) -> dict[str, Any]:
    """Q, K, V (B=2, H=2, T, S, d=16) in float64 and the mask / bias / scale of ``case`` (T = S,
    T < S: queries after cached keys, or T = 1: a decoding step); the boolean masks block every
    key of one query row (batch 1, row 0)."""
    t, s = {"padding": (5, 5), "causal (unbuilt)": (5, 5), "one query": (1, 6)}.get(case, (3, 6))
    q, k, v = (torch.randn(2, 2, n, 16, generator=g, dtype=torch.float64) for n in (t, s, s))
    padding = torch.ones(2, 1, t, s, dtype=torch.bool)
    padding[0, :, :, s - 2 :] = False  # the last two keys of sentence 0
    padding[1, :, 0, :] = False  # a query row with no key at all
    bias = torch.randn(1, 2, t, s, generator=g, dtype=torch.float64)
    cases: dict[str, dict[str, Any]] = {
        "padding": {"mask": padding},
        "padding, scale 0.3": {"mask": padding, "scale": 0.3},
        "bias and padding, scale 1": {"mask": padding, "bias": bias, "scale": 1.0},
        "bias only": {"bias": bias},
        "causal (unbuilt)": {"mask": CAUSAL},
        "causal (built) and padding": {"mask": padding & causal_mask(t, s)},
        "causal, queries after a cache": {"mask": CAUSAL},
        "one query": {"mask": padding},
        "no mask": {},
    }
    return {"q": q, "k": k, "v": v, **cases[case]}


ATTENTION_CASES = [
    "padding",
    "padding, scale 0.3",
    "bias and padding, scale 1",
    "bias only",
    "causal (unbuilt)",
    "causal (built) and padding",
    "causal, queries after a cache",
    "one query",
    "no mask",
]


def _attend(c: dict[str, Any], device: torch.device, dtype: torch.dtype, **kw: Any) -> Any:
    """aiayn's attention on ``c`` moved to ``device`` / ``dtype``."""
    mask: Mask = c.get("mask")
    if isinstance(mask, Tensor):
        mask = mask.to(device)
    bias = c.get("bias")
    q, k, v = (c[n].to(device, dtype) for n in "qkv")
    return scaled_dot_product_attention(
        q,
        k,
        v,
        mask,
        bias=None if bias is None else bias.to(device, dtype),
        scale=c.get("scale"),
        **kw,
    )


def _under_backend(backend: str, run: Callable[[], Any]) -> Any | None:
    """``run()`` with PyTorch's fused attention restricted to ``backend`` (``default``: not
    restricted); None where that backend does not take these inputs (PyTorch: "No available
    kernel" on CUDA, "No viable backend" on the CPU)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend == "default":
        return run()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch says why each refused backend refused
        with sdpa_kernel(getattr(SDPBackend, backend)):
            try:
                return run()
            except RuntimeError as error:
                if any(m in str(error) for m in ("No available kernel", "No viable backend")):
                    return None
                raise


def _blocked_rows(c: dict[str, Any]) -> Tensor | None:
    """(B, 1|H, T, 1) True where a query row may attend to no key, or None."""
    mask = c.get("mask")
    if not isinstance(mask, Tensor):
        return None
    return ~mask.any(dim=-1, keepdim=True)


@pytest.mark.parametrize("dtype", list(DTYPE_TOLERANCE), ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("case", ATTENTION_CASES)
@torch.no_grad()
def test_attention_on_device_equals_fp64_cpu_on_every_backend(
    case: str, dtype: torch.dtype
) -> None:
    """PyTorch's choice of fused-attention backend, and each backend that takes the inputs, give
    the float64 CPU result to the dtype's precision; fully blocked rows are exact zeros."""
    c = _attention_case(case, torch.Generator().manual_seed(len(case)))
    want, _ = _attend(c, CPU, torch.float64)
    blocked = _blocked_rows(c)
    ran = []
    for backend in BACKENDS:
        result = _under_backend(backend, lambda: _attend(c, DEVICE, dtype)[0])
        if result is None:
            continue
        ran.append(backend)
        assert result.dtype == dtype and result.device.type == DEVICE.type
        _close(result, want, DTYPE_TOLERANCE[dtype], f"{case}, {dtype}, {backend}")
        if blocked is not None:
            rows = result.cpu().masked_select(blocked.expand_as(result))
            assert rows.numel() > 0 and bool((rows == 0).all()), f"{case}, {backend}: not zero"
    assert {"default", "MATH"} <= set(ran), f"{case} in {dtype} ran on {ran} only"


@pytest.mark.parametrize("case", ["padding", "bias and padding, scale 1", "causal (unbuilt)"])
@torch.no_grad()
def test_attention_weights_on_device_equal_cpu(case: str) -> None:
    """``need_weights``: the (B, H, T, S) weights too, rows summing to 1 or (fully blocked) 0."""
    c = _attention_case(case, torch.Generator().manual_seed(3))
    want_out, want_w = _attend(c, CPU, torch.float64, need_weights=True)
    out, weights = _attend(c, DEVICE, torch.float32, need_weights=True)
    _close(out, want_out, 1e-5, f"{case} output")
    _close(weights, want_w, 1e-5, f"{case} weights")
    sums = weights.sum(dim=-1).cpu().double()
    assert bool(((sums - 1).abs() < 1e-5).logical_or(sums == 0).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_gradients_with_a_fully_masked_row(backend: str) -> None:
    """Gradients through attention with a query row that sees no key: finite, equal to the
    float64 CPU gradients, and zero for that row's query."""
    c = _attention_case("bias and padding, scale 1", torch.Generator().manual_seed(5))
    weight = torch.randn(
        2, 2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(6)
    )

    def grads(device: torch.device, dtype: torch.dtype) -> list[Tensor] | None:
        leaves = {n: c[n].to(device, dtype, copy=True).requires_grad_() for n in "qkv"}
        run = {**c, **leaves}

        def backward() -> list[Tensor]:
            out, _ = scaled_dot_product_attention(
                leaves["q"], leaves["k"], leaves["v"], run["mask"].to(device),
                bias=run["bias"].to(device, dtype), scale=run["scale"],
            )  # fmt: skip
            (out * weight[:, :, : out.size(2)].to(device, dtype)).sum().backward()
            return [leaves[n].grad for n in "qkv"]

        return backward() if device == CPU else _under_backend(backend, backward)

    want = grads(CPU, torch.float64)
    got = grads(DEVICE, torch.float32)
    assert want is not None
    if got is None:
        pytest.skip(f"{backend} does not take these inputs here (fp32, a boolean mask and a bias)")
    for n, g, w in zip("qkv", got, want, strict=True):
        _close(g, w, 1e-5, f"d{n} under {backend}")
    assert bool((got[0][1, :, 0] == 0).all()), "the blocked row's query has a gradient"


# -- decoding -------------------------------------------------------------------------------------

TRANSLATORS = [f.name for f in families_serving("translate")]
SOURCES = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15], [16]]


def _translator(name: str) -> EncoderDecoder:
    model = _random_model(FAMILIES[name], vocab_size=40)
    assert isinstance(model, EncoderDecoder)
    return model


def _hypotheses(model: EncoderDecoder, sources: list[list[int]], beam: int) -> list[Any]:
    tokenizer = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS)
    options = DecodeOptions(beam_size=beam, n_best=beam, extra_len=5)
    rows = translate_ids(model, sources, tokenizer, options)
    return [[(h.tokens, h.score) for h in row] for row in rows]


def _same_hypotheses(got: list[Any], want: list[Any], what: str) -> None:
    assert [[t for t, _ in row] for row in got] == [[t for t, _ in row] for row in want], what
    for row, want_row in zip(got, want, strict=True):
        scores = [s for _, s in row]
        want_scores = [s for _, s in want_row]
        assert scores == pytest.approx(want_scores, rel=1e-5, nan_ok=True), what


@pytest.mark.parametrize("beam", [1, 3], ids=["greedy", "beam 3"])
@pytest.mark.parametrize("name", TRANSLATORS)
def test_translation_search_on_device_equals_cpu(name: str, beam: int) -> None:
    """translate_ids (the inference step, length batches, per-sentence limits) on the device gives
    the CPU's hypotheses and scores, in float64."""
    model = _translator(name)
    want = _hypotheses(model, SOURCES, beam)
    got = _hypotheses(copy.deepcopy(model).to(DEVICE), SOURCES, beam)
    assert any(row[0][0] for row in want), "every translation empty: the test would see nothing"
    _same_hypotheses(got, want, f"{name}, beam {beam}")


@pytest.mark.parametrize("name", TRANSLATORS)
def test_beam_search_on_device_is_batch_invariant(name: str) -> None:
    """On the device, a sentence decoded alone and in a padded batch gets the same hypotheses."""
    model = copy.deepcopy(_translator(name)).to(DEVICE)
    together = _hypotheses(model, SOURCES, 3)
    for i, source in enumerate(SOURCES):
        _same_hypotheses([together[i]], _hypotheses(model, [source], 3), f"{name} sentence {i}")


@pytest.mark.parametrize("make_step", [inference_step, encoder_decoder_step])
@pytest.mark.parametrize("name", TRANSLATORS)
@torch.no_grad()
def test_cached_step_on_device_equals_the_full_forward(name: str, make_step: Any) -> None:
    """On the device, each step with the key/value cache (the flattened inference step and the
    module step) gives the log-probabilities of the full forward pass over the prefix, for a
    padded batch, banned tokens aside."""
    model = copy.deepcopy(_translator(name)).to(DEVICE)
    src = torch.tensor([[5, 6, 7, EOS], [8, EOS, PAD, PAD]], device=DEVICE)
    tgt = torch.tensor([[BOS, 9, 10, 11, 12], [BOS, 13, 14, 15, 16]], device=DEVICE)
    step, state = make_step(model, src)
    full = model(src, tgt)  # (B, T, V)
    allowed = torch.ones(full.size(-1), dtype=torch.bool)
    allowed[[PAD, BOS]] = False
    allowed = allowed.to(DEVICE)
    for t in range(tgt.size(1)):
        log_probs, state = step(tgt[:, t : t + 1], state)
        assert log_probs.device.type == DEVICE.type
        _close(log_probs[:, allowed], full[:, t, allowed], 2e-5, f"{name} step {t}")


def test_greedy_argmax_on_device_breaks_ties_as_on_cpu() -> None:
    """Greedy search's choice (:func:`~aiayn.decoding.argmax.first_argmax`) on the device: the
    first of equal maxima, a row's first NaN, 0 for a row of −inf, as on the CPU, over a short
    and a long (chunked on CPU) vocabulary."""
    for vocab in (50, 40_000):
        x = torch.randn(5, vocab, generator=torch.Generator().manual_seed(vocab)).round(decimals=1)
        x[0, [3, vocab - 7]] = 9.0  # a tie at the top
        x[1] = -math.inf  # every token banned
        x[2, [10, vocab // 2]] = math.nan
        x[3, vocab - 1] = 9.0  # the last element
        want = first_argmax(x)
        assert want[:4].tolist() == [3, 0, 10, vocab - 1]
        assert torch.equal(first_argmax(x.to(DEVICE)).cpu(), want), vocab


@pytest.mark.parametrize(("buckets", "distance"), [(32, 128), (32, 256), (64, 128)])
@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
def test_relative_position_buckets_on_device_equal_cpu(
    buckets: int, distance: int, bidirectional: bool
) -> None:
    """T5's buckets (float32 logarithms truncated to integers) of every relative position up to
    ±1100 are the CPU's on the device; a bucket boundary falls on whole distances (16, 32, …),
    where the last bit of a logarithm or a division decides."""
    relative = torch.arange(-1100, 1101)
    kw: dict[str, Any] = {
        "bidirectional": bidirectional,
        "num_buckets": buckets,
        "max_distance": distance,
    }
    want = relative_position_bucket(relative, **kw)
    got = relative_position_bucket(relative.to(DEVICE), **kw)
    differ = (got.cpu() != want).nonzero().flatten()
    assert not len(differ), f"buckets differ at relative positions {relative[differ].tolist()}"


def _gpt2() -> GPT2:
    family = next(f for f in FAMILIES.values() if f.model is GPT2)
    model = _random_model(family, vocab_size=50, max_len=32, bos_id=1, eos_id=2, pad_id=0)
    assert isinstance(model, GPT2)
    return model


PROMPTS = [[5, 6, 7, 8], [9], [10, 11, 12], [13, 14]]


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_gpt2_generation_on_device_equals_cpu(method: str) -> None:
    """generate_ids (left-padded prompts, prefill, key/value cache) gives the CPU's tokens on the
    device, in float64."""
    model = _gpt2()
    options = GenerateOptions(max_new_tokens=8, method=method, beam_size=3, batch_size=4)
    want = [[h.tokens for h in row] for row in generate_ids(model, PROMPTS, options)]
    dev = copy.deepcopy(model).to(DEVICE)
    got = [[h.tokens for h in row] for row in generate_ids(dev, PROMPTS, options)]
    assert any(row[0] for row in want)
    assert got == want


@torch.no_grad()
def test_gpt2_cached_greedy_on_device_equals_recomputing_the_prefix() -> None:
    """On the device, greedy generation with the key/value cache gives the tokens of greedy
    decoding that runs the whole sequence through the model at every step (no cache)."""
    model = copy.deepcopy(_gpt2()).to(DEVICE)
    options = GenerateOptions(max_new_tokens=8, batch_size=4)
    cached = [row[0].tokens for row in generate_ids(model, PROMPTS, options)]
    for prompt, got in zip(PROMPTS, cached, strict=True):
        sequence = list(prompt)
        for _ in range(8):
            ids = torch.tensor([sequence], device=DEVICE)
            log_probs = model.log_probs(model(ids).hidden[:, -1])[0]  # (V,)
            log_probs[[PAD, BOS]] = -math.inf  # generate's default bans (EOS is 2 here)
            token = int(log_probs.argmax())
            if token == model.config.eos_id:
                break
            sequence.append(token)
        assert got == sequence[len(prompt) :], prompt


# -- training and checkpoints ---------------------------------------------------------------------


def _trainer(
    tmp_path: Path, folder: str, device: torch.device, *, resume: bool = False, **train: Any
) -> Any:
    """The command line's Trainer on a tiny reverse-the-letters corpus, dropout off (so the two
    devices draw no random numbers in the steps), the device and the train keys given; fp32
    with a short warm-up unless they say otherwise."""
    from aiayn.training.trainer import Trainer

    helpers = load_test_file("training/conftest.py")
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    data = helpers.write_reverse_task(corpus, 200, seed=0)
    settings = {"device": str(device), "precision": "fp32", "warmup_steps": 4, **train}
    run = helpers.tiny_run(tmp_path / folder, data, model={"dropout": 0.0}, **settings)
    return Trainer(run, resume=resume)


@pytest.fixture
def _quiet_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("aiayn.training.trainer.log", lambda message: None)


@pytest.mark.usefixtures("_quiet_trainer")
def test_training_steps_on_device_follow_the_cpu_losses(tmp_path: Path) -> None:
    """Four fp32 steps (the trainer's train_step: fused loss, Adam, eq. 3's schedule) give the
    CPU's loss at every step."""
    losses = []
    for name, device in (("cpu", CPU), ("device", DEVICE)):
        trainer = _trainer(tmp_path, name, device)
        torch.backends.cuda.matmul.allow_tf32 = False  # the trainer turned it on for CUDA
        torch.backends.cudnn.allow_tf32 = False
        assert next(trainer.model.parameters()).device.type == device.type
        batches = trainer.sampler.batches(0)
        losses.append([float(trainer.train_step([b]).loss_sum) for b in batches[:4]])
    want, got = losses
    assert all(math.isfinite(x) for x in got)
    assert got == pytest.approx(want, rel=1e-4)


@pytest.mark.usefixtures("_quiet_trainer")
def test_bf16_training_on_device_lowers_the_loss_of_a_repeated_batch(tmp_path: Path) -> None:
    """train.precision bf16 (autocast): finite losses that fall on one batch seen again."""
    trainer = _trainer(tmp_path, "bf16", DEVICE, precision="bf16")
    assert trainer.amp_dtype == torch.bfloat16
    batch = trainer.sampler.batches(0)[0]
    losses = [float(trainer.train_step([batch]).loss_sum) for _ in range(10)]
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.usefixtures("_quiet_trainer")
def test_a_checkpoint_saved_on_device_loads_and_resumes_on_cpu(tmp_path: Path) -> None:
    """Saved after two steps on the device: loaded on the CPU, the same weights and Adam
    moments; a CPU run resumes from it and takes a finite step."""
    trainer = _trainer(tmp_path, "run", DEVICE)
    for b in trainer.sampler.batches(0)[:2]:
        trainer.train_step([b])
    path = trainer.save()
    ckpt = load_checkpoint(path)
    saved = ckpt.model.state_dict()
    for key, value in trainer.model.state_dict().items():
        assert saved[key].device == CPU and torch.equal(saved[key], value.cpu()), key
    moments = read_optimizer_state(path, ckpt.state)["state"]
    for index, per_param in trainer.optimizer.state_dict()["state"].items():
        for name, value in per_param.items():
            assert torch.equal(moments[index][name], value.cpu()), f"{index}.{name}"
    resumed = _trainer(tmp_path, "run", CPU, resume=True)
    assert resumed.step == 2 and resumed.device == CPU
    for key, value in resumed.model.state_dict().items():
        assert torch.equal(value, saved[key]), key
    stats = resumed.train_step([resumed.sampler.batches(0)[2]])
    assert stats.skipped is None and math.isfinite(float(stats.loss_sum))


# -- the CPU-only kernels on the device -----------------------------------------------------------

needs_other_device = pytest.mark.skipif(ON_CPU, reason="what CPU-only kernels do off the CPU")


@torch.no_grad()
def test_int8_linear_on_device_equals_the_cpu_kernels() -> None:
    """An int8 layer moved to the device runs the scheme in fp32 operations there (its CPU
    kernels refuse other devices): the CPU kernels' outputs, up to the last bits of the scales
    (the integer sums are exact on both), for all of W and for a block of its rows."""
    torch.manual_seed(0)
    layer = QuantizedLinear.of(nn.Linear(48, 40))
    x = torch.randn(3, 5, 48)
    dev = copy.deepcopy(layer).to(DEVICE)
    got = dev(x.to(DEVICE))
    assert got.device.type == DEVICE.type and dev.weight.dtype == torch.int8
    _close(got, layer(x), 1e-6, "int8 linear")
    rows = slice(8, 24)  # a block of its rows, as attention's stacked projection asks
    _close(dev(x.to(DEVICE), rows), layer(x, rows), 1e-6, "int8 linear, rows 8..23")


@pytest.mark.parametrize("name", FAMILY_IDS)
@torch.no_grad()
def test_int8_models_on_device_match_cpu(name: str) -> None:
    """quantize_model, then moved to the device: runs there, close to the int8 model on the CPU
    (an activation's rounding may flip where fp32 sums differ in their last bits)."""
    family = FAMILIES[name]
    model = _random_model(family).float()
    quantize_model(model)
    x = _inputs(family, model.config)
    want = _forward(family, model, x)
    got = _forward(family, copy.deepcopy(model).to(DEVICE), x)
    for key, value in got.items():
        if key.startswith("out.cache"):
            continue  # keys/values: compared through the outputs they make
        _close(value, want[key], 2e-2, f"{name} int8 {key}")


@needs_other_device
def test_packing_leaves_a_device_model_as_it_is() -> None:
    """pack_for_inference packs CPU models only: a device model comes back unchanged (the
    searches then run its own layers); a PackedLinear of a device layer is refused by name."""
    model = copy.deepcopy(_translator(TRANSLATORS[0])).float().to(DEVICE)
    assert pack_for_inference(model) is model
    with pytest.raises(ValueError, match="PackedLinear needs an fp32 CPU layer"):
        PackedLinear(nn.Linear(4, 4).to(DEVICE))


@needs_other_device
@pytest.mark.skipif(not packing_available(), reason="this PyTorch build has no oneDNN kernels")
def test_translate_with_packing_asked_on_device_equals_without() -> None:
    """``DecodeOptions.pack`` (the default) is ignored on the device: pack=False's hypotheses."""
    model = copy.deepcopy(_translator(TRANSLATORS[0])).float().to(DEVICE)
    tokenizer = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS)
    packed, plain = (
        translate_ids(model, SOURCES, tokenizer, DecodeOptions(beam_size=2, pack=p))
        for p in (True, False)
    )
    assert [[h.tokens for h in r] for r in packed] == [[h.tokens for h in r] for r in plain]


@needs_other_device
@torch.no_grad()
def test_aiayns_cpu_attention_kernel_is_not_called_on_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A decoding step's attention (fp32, one query, no gradients) on the device does not reach
    the CPU kernel, and equals the float64 CPU result."""
    import aiayn.attention.scaled_dot_product as sdp

    def refuse() -> None:
        raise AssertionError("the CPU attention kernel was asked for on the device")

    monkeypatch.setattr(sdp, "native_attend", refuse)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, n, 16, generator=g, dtype=torch.float64) for n in (1, 7, 7))
    mask = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 4:] = False
    want, _ = scaled_dot_product_attention(q, k, v, mask)  # float64: the explicit path
    q, k, v = (t.to(DEVICE, torch.float32) for t in (q, k, v))
    got, _ = scaled_dot_product_attention(q, k, v, mask.to(DEVICE))
    _close(got, want, 1e-5, "decoding-step attention")


# -- the service ----------------------------------------------------------------------------------


def _served_translations(checkpoint: Path, device: str, beam: int) -> list[str]:
    from fastapi.testclient import TestClient

    from aiayn.serving import ServeOptions, create_app, load_served_model
    from aiayn.serving.metrics import Metrics

    options, metrics = ServeOptions(), Metrics()
    model = load_served_model("mt", checkpoint, options, metrics, device=device)
    request = {"texts": ["a small dog runs", "the cat sleeps on the mat"], "beam": beam,
               "max_new_tokens": 10}  # fmt: skip
    with TestClient(create_app([model], options, metrics)) as client:
        response = client.post("/v1/translate", json=request)
    assert response.status_code == 200, response.text
    return [t["text"] for t in response.json()["translations"]]


def _sharp_translation_checkpoint(folder: Path) -> Path:
    """The service tests' tiny translation checkpoint, its output layer scaled up so that the
    next token's log-probability leads the runner-up by far more than float32's error."""
    serving = load_test_file("serving/conftest.py")
    path = serving.make_translation(folder)
    ckpt = load_checkpoint(path)
    with torch.no_grad():
        ckpt.model.output_proj.weight.mul_(8.0)
    return save_checkpoint(folder / "sharp", ckpt.model, {"step": 1}, ckpt.tokenizer_path)


@pytest.mark.parametrize("beam", [1, 3], ids=["greedy", "beam 3"])
def test_served_translation_on_device_equals_cpu(tmp_path: Path, beam: int) -> None:
    """``aiayn serve --device``: a translate request answered on the device equals the CPU's."""
    checkpoint = _sharp_translation_checkpoint(tmp_path)
    want = _served_translations(checkpoint, "cpu", beam)
    assert any(want)
    assert _served_translations(checkpoint, str(DEVICE), beam) == want


@torch.no_grad()
def test_fill_mask_on_device_equals_cpu(tmp_path: Path) -> None:
    """``aiayn fill-mask --device`` (and the service's fill-mask endpoint): a converted BERT
    on the device predicts the CPU's tokens with the CPU's probabilities, in float64."""
    from aiayn.cli.fill_mask import load_bert
    from aiayn.inference.encoder_tasks import fill_mask

    checkpoint = load_test_file("serving/conftest.py").make_bert(tmp_path, "mlm")
    model, tokenizer = load_bert(str(checkpoint), "cpu", "fill-mask", head="mlm")
    model = model.double()
    text = "the cat [MASK] on the [MASK] ."
    want = fill_mask(model, tokenizer, text, top_k=3)
    got = fill_mask(copy.deepcopy(model).to(DEVICE), tokenizer, text, top_k=3)
    assert len(want) == 2
    for got_row, want_row in zip(got, want, strict=True):
        assert [p.token_id for p in got_row] == [p.token_id for p in want_row]
        probabilities = [p.probability for p in want_row]
        assert [p.probability for p in got_row] == pytest.approx(probabilities, rel=1e-5)
