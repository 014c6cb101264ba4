"""64 concurrent clients with sentences and prompts of mixed lengths and options: every answer
equals the offline library's for its own input alone; none lost, none mixed up."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiayn.checkpoint import load_checkpoint, load_translation_tokenizer
from aiayn.data import normalize
from aiayn.data.text_tokenizer import load_lm_tokenizer
from aiayn.decoding import GenerateOptions, generate
from aiayn.decoding.translate import options_for_checkpoint, translate_ids
from aiayn.inference.packed import pack_for_inference
from aiayn.models.gpt2 import GPT2

WORDS = ["a", "small", "dog", "runs", "the", "cat", "sleeps", "on", "mat", "two", "men", "play"]


def _sentence(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(1 + i % 9))


def _requests() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(64):
        if i % 2 == 0:
            beam = (1, 2)[(i // 2) % 2]
            out.append(("/v1/translate", {"texts": [_sentence(i)], "beam": beam,
                                          "max_new_tokens": 4 + i % 7}))  # fmt: skip
        else:
            req: dict[str, Any] = {"prompt": _sentence(i), "max_tokens": 2 + i % 11}
            if i % 4 == 1:
                req.update(temperature=0.9, seed=i)
            out.append(("/v1/completions", req))
    return out


@functools.cache
def _loaded(folder: Path, lm: bool) -> tuple[Any, Any]:
    """The model packed once, as the library packs it per call (``pack=True``), and its
    tokenizer: the offline calls below run it with ``pack=False``, the same arithmetic."""
    if lm:
        c = load_checkpoint(folder, expect=GPT2)
        return pack_for_inference(c.model), load_lm_tokenizer(c.tokenizer_path)
    c = load_checkpoint(folder)
    return pack_for_inference(c.model), load_translation_tokenizer(c.path)


def _offline(checkpoints: dict[str, Path], path: str, req: dict[str, Any]) -> str:
    if path == "/v1/translate":
        model, tok = _loaded(checkpoints["mt"], False)
        o = options_for_checkpoint(
            None, beam_size=req["beam"], max_new_tokens=req["max_new_tokens"], pack=False
        )
        ids = tok.encode_batch([normalize(t) for t in req["texts"]])
        return tok.decode_batch([translate_ids(model, ids, tok, o)[0][0].tokens])[0]
    model, tok = _loaded(checkpoints["lm"], True)
    method = "sample" if "temperature" in req else "greedy"
    extra = {"temperature": 0.9, "seed": req["seed"]} if method == "sample" else {}
    options = GenerateOptions(max_new_tokens=req["max_tokens"], method=method, pack=False, **extra)
    return generate(model, tok, [req["prompt"]], options)[0]


def _text(path: str, body: dict[str, Any]) -> str:
    if path == "/v1/translate":
        return str(body["translations"][0]["text"])
    return str(body["choices"][0]["text"])


def test_64_concurrent_clients_each_get_their_own_offline_answer(
    checkpoints: dict[str, Path], serve_app: Any
) -> None:
    requests = _requests()
    with serve_app(checkpoints, ["mt", "lm"], max_wait_ms=2) as client:

        def call(item: tuple[str, dict[str, Any]]) -> Any:
            return client.post(item[0], json=item[1])

        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(call, requests))
        metrics = client.get("/metrics").text
    assert all(r.status_code == 200 for r in answers), [
        r.text for r in answers if r.status_code != 200
    ]
    got = [_text(path, r.json()) for (path, _), r in zip(requests, answers, strict=True)]
    expected = [_offline(checkpoints, path, req) for path, req in requests]
    assert got == expected
    # batching happened: some decoding step ran more than one row
    rows = [line for line in metrics.splitlines() if line.startswith("aiayn_batch_size_bucket")
            and 'le="1.0"' in line]  # fmt: skip
    counts = [line for line in metrics.splitlines() if line.startswith("aiayn_batch_size_count")]
    assert any(
        float(a.split()[-1]) < float(b.split()[-1]) for a, b in zip(rows, counts, strict=True)
    )
