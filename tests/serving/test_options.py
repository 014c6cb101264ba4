"""The service's options: decode workers (bounded, named when bad, defaulting to the machine's
setting) and how the process's CPU threads are shared out between them."""

from __future__ import annotations

import pytest

from aiayn.serving.options import ServeOptions, intra_op_threads
from aiayn.settings import performance_settings


def test_decode_workers_default_to_the_setting_and_are_bounded() -> None:
    assert ServeOptions().decode_workers == 2
    with performance_settings(serve_decode_workers=3):
        assert ServeOptions().decode_workers == 3
    assert ServeOptions(decode_workers=64).decode_workers == 64
    for bad in (0, 65):
        with pytest.raises(ValueError, match="decode_workers"):
            ServeOptions(decode_workers=bad)


@pytest.mark.parametrize(
    ("threads", "workers", "batching", "want"),
    [
        (2, 2, True, 1),
        (16, 2, True, 8),
        (1, 2, True, 1),
        (7, 3, True, 2),
        (2, 1, True, 2),
        (16, 4, False, 16),
    ],
)
def test_threads_are_shared_out_between_decode_workers(
    threads: int, workers: int, batching: bool, want: int
) -> None:
    options = ServeOptions(decode_workers=workers, batching=batching)
    assert intra_op_threads(threads, options) == want
