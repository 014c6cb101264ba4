"""Helpers shared by the benchmarks: machine description, matmul peak, statistics, reports."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from aiayn.kernels import cpu
from aiayn.kernels.dispatch import table

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "docs" / "results"
"""Each report's Markdown table, NAME.md, where the docs link it."""
RESULTS = ROOT / "results"
"""Each report's raw numbers, NAME.json.gz (gzipped JSON), and Multi30k's per-run results:
what the tables are made from, kept out of docs/ (docs/benchmarks.md, "Where results live")."""


MATMUL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")
"""The /proc/cpuinfo flags that decide which matmul kernels a CPU can run."""


def describe_cpu(cpuinfo: str) -> str:
    """The CPU as /proc/cpuinfo's text names it: model name, family and model numbers, and the
    matmul-relevant flags it has, e.g. "AMD EPYC (family 25, model 17; avx2 avx512f
    avx512_vnni)". "" when the text names no model."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name", "")
    if not name:
        return ""
    flags = set(fields.get("flags", "").split())
    have = " ".join(f for f in MATMUL_FLAGS if f in flags) or "none of " + ", ".join(MATMUL_FLAGS)
    family, model = fields.get("cpu family"), fields.get("model")
    numbers = f"family {family}, model {model}; " if family and model else ""
    return f"{name} ({numbers}{have})"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        cpu = describe_cpu(Path("/proc/cpuinfo").read_text()) or cpu
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


class Peak(NamedTuple):
    """A measured matmul peak: the fastest kernel's rate (FLOP/s, or integer OP/s for int8),
    that kernel's name, and every kernel's rate (None where the kernel is missing here)."""

    flops: float
    kernel: str
    by_kernel: dict[str, float | None]

    def describe(self, unit: str = "GFLOP/s") -> str:
        """ "X GFLOP/s (kernel; others: k1 Y, k2 Z)" for a table's caption."""
        others = ", ".join(
            f"{name} {rate / 1e9:,.0f}" if rate is not None else f"{name} n/a"
            for name, rate in self.by_kernel.items()
            if name != self.kernel
        )
        return f"{self.flops / 1e9:,.0f} {unit} ({self.kernel}; others: {others or 'none'})"


def fastest(rates: dict[str, float | None]) -> tuple[str, float]:
    """The kernel with the highest rate and that rate; kernels missing here (None) or that
    failed (NaN) are skipped. ValueError when none ran."""
    ran = {k: v for k, v in rates.items() if v is not None and v == v}
    if not ran:
        raise ValueError("no matmul kernel ran")
    name = max(ran, key=lambda k: ran[k])
    return name, ran[name]


def fp32_kernels(n: int) -> dict[str, Callable[[], object] | None]:
    """Square fp32 products of side ``n`` on CPU, by kernel: PyTorch's ``torch.mm`` (MKL, which
    runs AVX2 code on AMD CPUs) and oneDNN's linear on a weight packed once
    (``torch.ops.mkldnn._linear_pointwise``, AVX-512 where the CPU has it; what
    ``aiayn.inference.pack_for_inference`` runs). None: not in this PyTorch build."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    kernels: dict[str, Callable[[], object] | None] = {
        "torch.mm (MKL)": lambda: torch.mm(a, b, out=out)
    }
    mkldnn = torch.ops.mkldnn
    if torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_linear_pointwise"):
        packed = mkldnn._reorder_linear_weight(b.t().contiguous(), None)  # (N, K) as a weight
        kernels["oneDNN packed linear"] = lambda: mkldnn._linear_pointwise(
            a, packed, None, "none", [], ""
        )
    else:
        kernels["oneDNN packed linear"] = None
    return kernels


def int8_kernels(n: int) -> dict[str, Callable[[], object] | None]:
    """Square int8 products of side ``n`` on CPU, by kernel: ``torch._int_mm`` (s8 × s8 → s32),
    and the quantized engines' linear on a prepacked per-channel s8 weight, static (u8
    activations in) and dynamic (fp32 in, quantised per call, fp32 out): x86 (fbgemm or
    oneDNN, chosen per shape), fbgemm, onednn (VNNI where the CPU has it). The weight-only
    ``_weight_int8pack_mm`` is a matrix–vector kernel (fp32 activations; about 1 GOP/s on a
    square product here) and is not a GEMM peak: left out."""
    g = torch.Generator().manual_seed(0)
    a8 = torch.randint(-128, 128, (n, n), dtype=torch.int8, generator=g)
    b8 = torch.randint(-128, 128, (n, n), dtype=torch.int8, generator=g)
    kernels: dict[str, Callable[[], object] | None] = {
        "torch._int_mm": lambda: torch._int_mm(a8, b8)
    }
    a, w = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    engines = torch.backends.quantized.supported_engines
    with warnings.catch_warnings():  # quantized tensors are deprecated in PyTorch 2.1x
        warnings.simplefilter("ignore")
        scales = w.abs().amax(dim=1) / 127
        qw = torch.quantize_per_channel(w, scales, torch.zeros(n, dtype=torch.long), 0, torch.qint8)
        qa = torch.quantize_per_tensor(a, float(a.abs().max()) / 127, 128, torch.quint8)
        for engine in ("x86", "fbgemm", "onednn"):
            if engine not in engines:
                kernels[f"quantized.linear ({engine})"] = None
                kernels[f"quantized.linear_dynamic ({engine})"] = None
                continue
            kernels.update(_quantized_linears(engine, qw, qa, a))
    return kernels


def _quantized_linears(
    engine: str, qw: Tensor, qa: Tensor, a: Tensor
) -> dict[str, Callable[[], object] | None]:
    """Static and dynamic quantized linears of one engine (the engine is set around each call;
    the weights are packed under it)."""

    def under(fn: Callable[[], object]) -> Callable[[], object]:
        def call() -> object:
            before = torch.backends.quantized.engine
            torch.backends.quantized.engine = engine
            try:
                return fn()
            finally:
                torch.backends.quantized.engine = before

        return call

    # one packed weight each: onednn's dynamic linear crashes (PyTorch 2.13) on a packed weight
    # that a static linear has used
    static, dynamic = (under(lambda: torch.ops.quantized.linear_prepack(qw, None))() for _ in "sd")
    return {
        f"quantized.linear ({engine})": under(
            lambda: torch.ops.quantized.linear(qa, static, 0.1, 128)
        ),
        f"quantized.linear_dynamic ({engine})": under(
            lambda: torch.ops.quantized.linear_dynamic(a, dynamic)
        ),
    }


def time_product(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` calls after two warm-up calls."""
    times = []
    for i in range(repeats + 2):
        start = time.perf_counter()
        fn()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peaks(kind: str = "fp32", n: int = 2048, repeats: int = 7) -> Peak:
    """The CPU's measured matmul peak of ``kind`` ("fp32" or "int8"): the fastest of every kernel
    PyTorch offers here (:func:`fp32_kernels`, :func:`int8_kernels`), each timed on square
    products of side ``n`` (2·n³ operations; median of ``repeats``)."""
    kernels = fp32_kernels(n) if kind == "fp32" else int8_kernels(n)
    rates: dict[str, float | None] = {}
    for name, fn in kernels.items():
        try:
            rates[name] = None if fn is None else 2 * n**3 / time_product(fn, repeats)
        except RuntimeError:  # a kernel this CPU or build refuses
            rates[name] = None
    name, rate = fastest(rates)
    return Peak(rate, name, rates)


def device_peak(device: str = "cpu", dtype: torch.dtype = torch.float32, repeats: int = 7) -> Peak:
    """Measured matmul peak of ``device`` in ``dtype``. CPU fp32: the fastest kernel of
    :func:`matmul_peaks` (``torch.mm`` alone understates it where MKL runs AVX2 code while
    oneDNN runs AVX-512). Otherwise (CUDA, other dtypes): the median of ``repeats`` square
    ``torch.mm`` products, n = 8192 on CUDA, 2048 on CPU."""
    if device == "cpu" and dtype == torch.float32:
        return matmul_peaks("fp32", repeats=repeats)
    n = 8192 if device.startswith("cuda") else 2048
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def product() -> None:
        torch.mm(a, b, out=out)
        sync(device)

    sync(device)
    rate = 2 * n**3 / time_product(product, repeats)
    return Peak(rate, "torch.mm", {"torch.mm": rate})


def matmul_peak(device: str = "cpu", dtype: torch.dtype = torch.float32, repeats: int = 7) -> float:
    """Measured matmul throughput in FLOP/s: :func:`device_peak`'s rate."""
    return device_peak(device, dtype, repeats).flops


def sync(device: str | torch.device) -> None:
    """Wait for queued GPU work (no-op on CPU)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Wall times of ``repeats`` calls of each function, taken in rounds (one call of each per
    round, after one warm-up call of each), so that all of them meet the same machine: this
    VM's memory bandwidth drifts by tens of percent over minutes."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def fmt(s: dict[str, float], scale: float = 1.0, digits: int = 0) -> str:
    """ "median (min–max)" of :func:`spread`, scaled."""
    m, lo, hi = (s[k] * scale for k in ("median", "min", "max"))
    return f"{m:,.{digits}f} ({lo:,.{digits}f}–{hi:,.{digits}f})"


def command_line() -> str:
    """The command that is running, as one would type it again."""
    script = Path(sys.argv[0])
    with contextlib.suppress(ValueError):  # a script outside the repository: keep its path
        script = script.resolve().relative_to(ROOT)
    return " ".join(["python", shlex.quote(str(script)), *map(shlex.quote, sys.argv[1:])])


def raw_path(name: str, folder: Path | None = None) -> Path:
    """Where report NAME's raw numbers are: ``folder``/NAME.json.gz (default: results/)."""
    return (RESULTS if folder is None else folder) / f"{name}.json.gz"


def write_json_gz(path: Path, data: Any) -> None:
    """``data`` as gzipped JSON at ``path``, whole or not at all (written beside it, then moved
    over it). The same data gives the same bytes: no time or file name in the gzip header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
        gz.write((json.dumps(data, indent=1) + "\n").encode("utf-8"))
    tmp.replace(path)


def read_json(path: Path) -> Any:
    """The JSON at ``path``, gzipped (by its first bytes, whatever its name) or plain."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw.decode("utf-8"))


def write_report(
    name: str,
    data: dict[str, Any],
    markdown: list[str],
    *,
    tables: Path | None = None,
    raw: Path | None = None,
) -> Path:
    """NAME.md in ``tables`` (default docs/results/) and NAME.json.gz in ``raw`` (default
    results/); returns the Markdown path."""
    write_json_gz(raw_path(name, raw), data)
    path = (TABLES if tables is None else tables) / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(markdown) + "\n", encoding="utf-8")
    return path


def aiayn_kernels() -> str:
    """What aiayn's fp32 and int8 models run on here, by the dispatch table in force
    (:mod:`aiayn.kernels.dispatch`): one line for a report's caption."""
    rows = "; ".join(f"{r.operation}, {r.sizes}: {r.kernel}" for r in table())
    return f"CPU class {cpu.level()}: {rows}"


CPU_CLASSES: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {
        "AIAYN_CPU_CAP": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "generic": {
        "AIAYN_CPU_CAP": "generic",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "ATEN_CPU_CAPABILITY": "default",
    },
}
"""The CPU classes a benchmark can run as, by the caps that make this machine one: aiayn's
dispatch (``AIAYN_CPU_CAP``), oneDNN's (``ONEDNN_MAX_CPU_ISA``), PyTorch's vector code
(``ATEN_CPU_CAPABILITY``) and MKL's (``MKL_ENABLE_INSTRUCTIONS``, which PyTorch's fp32 GEMMs
and CTranslate2's MKL backend use), each read when its library starts, so each class runs in a
process of its own."""


def add_cpu_class_flags(parser: Any) -> None:
    """``--cpu-classes``: the classes to run as, each in a child process of its own with its
    caps; ``--cpu-class`` (set by the parent in each child): the one this process runs as."""
    parser.add_argument(
        "--cpu-classes",
        nargs="+",
        choices=sorted(CPU_CLASSES),
        default=["native"],
        help="CPU classes to run as, one process each",
    )
    parser.add_argument("--cpu-class", choices=sorted(CPU_CLASSES), help=argparse_suppress())


def argparse_suppress() -> str:
    """argparse's marker for a flag left out of --help."""
    import argparse

    return argparse.SUPPRESS


def report_name(name: str, cpu_class: str | None) -> str:
    """A report's name for the CPU class it ran as: NAME for native, NAME_CLASS otherwise.

    E.g. ("translate_vs_ct2", "avx2") -> "translate_vs_ct2_avx2"; (…, None) -> "translate_vs_ct2".
    """
    return name if cpu_class in (None, "native") else f"{name}_{cpu_class}"


def run_cpu_classes(classes: list[str], script: str, argv: list[str]) -> None:
    """Run ``script`` once per CPU class, one after the other, each in a child process with the
    class's caps and ``--cpu-class``; ``argv``: the script's arguments without --cpu-classes."""
    import subprocess

    for cpu_class in classes:
        env = {**os.environ, **CPU_CLASSES[cpu_class]}
        command = [sys.executable, script, *argv, "--cpu-class", cpu_class]
        print(f"== CPU class {cpu_class}: {' '.join(command[1:])}", flush=True)
        subprocess.run(command, env=env, check=True)


def without_cpu_classes(argv: list[str]) -> list[str]:
    """``argv`` without ``--cpu-classes`` and its values.

    E.g. ["--rounds", "3", "--cpu-classes", "native", "avx2", "--seed", "1"] ->
    ["--rounds", "3", "--seed", "1"].
    """
    out, skipping = [], False
    for arg in argv:
        if arg == "--cpu-classes":
            skipping = True
        elif skipping and not arg.startswith("--"):
            continue
        else:
            skipping = False
            out.append(arg)
    return out
