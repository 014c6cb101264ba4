"""The random states a resumable checkpoint records (``state.json``: ``rng``, or ``rng_per_rank``
when several processes trained), so that a resumed run draws what an uninterrupted one would:
Python's, NumPy's and torch's (CPU and every CUDA device), as base64 text."""

from __future__ import annotations

import ast
import base64
import json
import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) random states, JSON-serialisable."""
    state: dict[str, Any] = {
        "python": _b64(repr(random.getstate()).encode()),
        "numpy": _b64(json.dumps(_np_state()).encode()),
        "torch": _b64(torch.get_rng_state().numpy().tobytes()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s.numpy().tobytes()) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved."""
    random.setstate(ast.literal_eval(_unb64(state["python"]).decode()))
    np_state = json.loads(_unb64(state["numpy"]).decode())
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
    torch.set_rng_state(torch.frombuffer(bytearray(_unb64(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(
            [torch.frombuffer(bytearray(_unb64(s)), dtype=torch.uint8) for s in state["cuda"]]
        )


def _np_state() -> list[Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))
