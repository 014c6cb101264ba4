"""aiayn.kernels.cpu: the CPU class from its flags by hand, the caps (environment and block),
and an unknown class refused by name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aiayn.errors import ConfigError
from aiayn.kernels import cpu

AVX512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"}


def test_the_class_of_a_cpus_flags_by_hand() -> None:
    assert cpu.level_of_flags(frozenset({"sse4_2", "avx"})) == "generic"
    assert cpu.level_of_flags(frozenset({"avx2"})) == "generic"  # AVX2 without FMA
    assert cpu.level_of_flags(frozenset({"avx2", "fma", "avx_vnni"})) == "avx2"  # Alder Lake
    assert cpu.level_of_flags(frozenset(AVX512)) == "avx512"  # Skylake-SP
    assert cpu.level_of_flags(frozenset(AVX512 | {"avx512_vnni"})) == "avx512_vnni"
    assert cpu.level_of_flags(frozenset({"avx512f", "avx512_vnni"})) == "generic"  # no AVX2


def test_a_cap_lowers_the_class_and_never_raises_it() -> None:
    found = cpu.detected()
    with cpu.capped("generic") as level:
        assert level == "generic" == cpu.level()
        with cpu.capped("avx512_vnni"):  # an inner, higher cap does not lift the outer one
            assert cpu.level() == "generic"
    assert cpu.level() in (found, cpu.environment_cap())
    with cpu.capped("avx512_vnni"):
        assert cpu.rank(cpu.level()) <= cpu.rank(found)


def test_an_unknown_class_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="unknown CPU class 'avx1024'"):
        cpu.rank("avx1024")
    with pytest.raises(ConfigError), cpu.capped("sse"):
        pass


@pytest.mark.parametrize("value, want", [("avx2", "avx2"), ("generic", "generic"), ("bogus", None)])
def test_the_environment_cap(value: str, want: str | None) -> None:
    code = (
        "from aiayn.kernels import cpu\n"
        "try:\n    print(cpu.level())\n"
        "except ValueError as e:\n    print('refused:', e)\n"
    )
    env = {"AIAYN_CPU_CAP": value, "PATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    if want is None:
        assert out == "refused: AIAYN_CPU_CAP='bogus': one of generic, avx2, avx512, avx512_vnni"
    else:  # the cap, or the CPU's own class where that is lower: a cap never raises it
        assert out == min(want, cpu.detected(), key=cpu.rank)
