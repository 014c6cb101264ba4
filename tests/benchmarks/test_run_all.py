"""The summary rows run_all.py takes from other reports: the CTranslate2 comparison pairs each
aiayn engine with its peer (fp32 with float32, int8 with CTranslate2's fastest int8 type), and
the peak's kernel is named, or said to be torch.mm alone for a report that predates it."""

from __future__ import annotations

from run_all import ct2_rows, peak_kernel


def test_ct2_rows_pair_each_engine_with_its_peer() -> None:
    report = {
        "rows": [
            {"batch": 1, "beam": 1, "tok_s": {"aiayn fp32": 120.0, "aiayn int8": 300.0,
             "CTranslate2 float32": 100.0, "CTranslate2 int8": 150.0,
             "CTranslate2 int8_float32": 200.0}},
            {"batch": 32, "beam": 4, "tok_s": {"aiayn fp32": 90.0, "CTranslate2 float32": 60.0}},
        ]
    }  # fmt: skip
    rows = ct2_rows(report)
    assert rows == [
        "| translation tok/s, batch 1, greedy, aiayn fp32 vs CTranslate2 float32 | opus-mt-en-de "
        "| 120 | 100 | 1.20× | |",
        "| translation tok/s, batch 1, greedy, aiayn int8 vs CTranslate2 int8_float32 "
        "| opus-mt-en-de | 300 | 200 | 1.50× | |",
        "| translation tok/s, batch 32, beam 4, aiayn fp32 vs CTranslate2 float32 | opus-mt-en-de "
        "| 90 | 60 | 1.50× | |",
    ]


def test_peak_kernel_names_the_winner_or_the_old_denominator() -> None:
    assert peak_kernel({"matmul_peak_kernel": "oneDNN packed linear"}).startswith(
        "oneDNN packed linear, the fastest"
    )
    assert peak_kernel({}).startswith("torch.mm alone")
