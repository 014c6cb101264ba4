"""Every endpoint through the in-process test client, on tiny random checkpoints of each served
family: the answers equal what the library functions behind the CLI commands give for the same
options (``aiayn translate``, ``generate``, ``embed``, ``classify-text``, ``fill-mask``,
``classify-image``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from aiayn.checkpoint import checkpoint_tokenizer, load_checkpoint, load_translation_tokenizer
from aiayn.cli.main import main
from aiayn.data import normalize
from aiayn.data.text_tokenizer import load_lm_tokenizer
from aiayn.decoding import GenerateOptions, generate
from aiayn.decoding.translate import options_for_checkpoint, translate_ids
from aiayn.inference.classify_text import classify_texts
from aiayn.inference.encoder_tasks import fill_mask, sentence_embeddings
from aiayn.models.bert import BERT
from aiayn.models.gpt2 import GPT2

SOURCES = ["a small dog runs", "the cat sleeps on the mat", "hello", "two men play chess chess"]
PROMPTS = ["the cat", "two men play", "a", "hello world the"]


def _translations(ckpt: Path, **given: Any) -> list[list[Any]]:
    c = load_checkpoint(ckpt)
    tok = load_translation_tokenizer(c.path)
    options = options_for_checkpoint(c.state.get("generation"), **given)
    hyps = translate_ids(c.model, tok.encode_batch([normalize(t) for t in SOURCES]), tok, options)
    return [[(tok.decode_batch([h.tokens])[0], h.score) for h in row] for row in hyps]


@pytest.mark.parametrize("beam", [1, 3])
def test_translate_equals_the_library(
    client: TestClient, checkpoints: dict[str, Path], beam: int
) -> None:
    n_best = 2 if beam > 1 else 1
    r = client.post("/v1/translate", json={"texts": SOURCES, "beam": beam, "n_best": n_best,
                                           "max_new_tokens": 12})  # fmt: skip
    assert r.status_code == 200, r.text
    got = r.json()["translations"]
    expected = _translations(checkpoints["mt"], beam_size=beam, n_best=n_best, max_new_tokens=12)
    assert [t["text"] for t in got] == [row[0][0] for row in expected]
    if beam > 1:
        for answer, row in zip(got, expected, strict=True):
            assert [h["text"] for h in answer["hypotheses"]] == [t for t, _ in row]
            assert [h["score"] for h in answer["hypotheses"]] == pytest.approx([s for _, s in row])
    else:
        assert all(t["score"] is None and t["hypotheses"] is None for t in got)


def _generated(ckpt: Path, prompts: list[str], **options: Any) -> list[str]:
    c = load_checkpoint(ckpt, expect=GPT2)
    return generate(
        c.model, load_lm_tokenizer(c.tokenizer_path), prompts, GenerateOptions(**options)
    )


def test_completions_greedy_equal_generate(
    client: TestClient, checkpoints: dict[str, Path]
) -> None:
    r = client.post("/v1/completions", json={"prompt": PROMPTS, "max_tokens": 7})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    expected = _generated(checkpoints["lm"], PROMPTS, max_new_tokens=7)
    assert [c["text"] for c in body["choices"]] == expected
    assert (
        body["usage"]["total_tokens"]
        == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    )


def test_seeded_sampling_equals_generate_and_each_choice_its_seed(
    client: TestClient, checkpoints: dict[str, Path]
) -> None:
    req = {"prompt": PROMPTS[:2], "max_tokens": 6, "temperature": 0.8, "top_p": 0.9, "seed": 5,
           "n": 2}  # fmt: skip
    first = client.post("/v1/completions", json=req).json()["choices"]
    assert client.post("/v1/completions", json=req).json()["choices"] == first  # reproducible
    for choice in (0, 1):
        expected = _generated(checkpoints["lm"], PROMPTS[:2], max_new_tokens=6, method="sample",
                              temperature=0.8, top_p=0.9, seed=5 + choice)  # fmt: skip
        assert [first[2 * p + choice]["text"] for p in (0, 1)] == expected


def test_stop_strings_cut_the_text(client: TestClient, checkpoints: dict[str, Path]) -> None:
    full = _generated(checkpoints["lm"], [PROMPTS[0]], max_new_tokens=10)[0]
    stop = full[3:5]
    assert stop
    r = client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 10, "stop": stop})
    choice = r.json()["choices"][0]
    assert choice["text"] == full[: full.find(stop)]
    assert choice["finish_reason"] == "stop"


def test_streaming_sends_the_same_text_in_openai_chunks(client: TestClient) -> None:
    req = {"prompt": PROMPTS[1], "max_tokens": 8}
    whole = client.post("/v1/completions", json=req).json()["choices"][0]
    r = client.post("/v1/completions", json={**req, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in r.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]


TEXTS = ["the cat sat on the mat .", "paris is a dog", "a book", "she sat on the log ."]


def _bert(ckpt: Path) -> tuple[Any, Any]:
    c = load_checkpoint(ckpt, expect=BERT)
    return c.model, checkpoint_tokenizer(c.path)


@pytest.mark.parametrize("normalize_", [True, False])
def test_embeddings_equal_embed(
    client: TestClient, checkpoints: dict[str, Path], normalize_: bool
) -> None:
    r = client.post(
        "/v1/embeddings", json={"model": "mlm", "input": TEXTS, "normalize": normalize_}
    )
    assert r.status_code == 200, r.text
    got = torch.tensor([d["embedding"] for d in r.json()["data"]])
    expected = sentence_embeddings(*_bert(checkpoints["mlm"]), TEXTS, normalize=normalize_)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    one = client.post("/v1/embeddings", json={"model": "mlm", "input": TEXTS[1]}).json()
    torch.testing.assert_close(
        torch.tensor(one["data"][0]["embedding"]),
        got[1] if normalize_ else torch.nn.functional.normalize(got[1], dim=0),
        rtol=0,
        atol=1e-6,
    )


def test_classify_texts_and_pairs_equal_classify_text(
    client: TestClient, checkpoints: dict[str, Path]
) -> None:
    model, tok = _bert(checkpoints["cls"])
    for pairs in (None, ["on the mat", "the capital", "x", "y"]):
        r = client.post("/v1/classify", json={"texts": TEXTS, "pairs": pairs, "top_k": 2})
        assert r.status_code == 200, r.text
        expected = classify_texts(model, tok, TEXTS, pairs, top_k=2)
        got = [[(x["label"], x["probability"]) for x in row] for row in r.json()["labels"]]
        assert got == [[(f"LABEL_{i}", pytest.approx(p)) for i, p in row] for row in expected]


def test_fill_mask_equals_fill_mask(client: TestClient, checkpoints: dict[str, Path]) -> None:
    texts = ["the cat sat on the [MASK] .", "[MASK] is the capital of [MASK] ."]
    r = client.post("/v1/fill-mask", json={"texts": texts, "top_k": 3})
    assert r.status_code == 200, r.text
    model, tok = _bert(checkpoints["mlm"])
    for got, text in zip(r.json()["predictions"], texts, strict=True):
        expected = fill_mask(model, tok, text, top_k=3)
        assert [[p["token_id"] for p in m] for m in got] == [
            [p.token_id for p in m] for m in expected
        ]
        assert [[p["sequence"] for p in m] for m in got] == [
            [p.sequence for p in m] for m in expected
        ]


def test_classify_image_equals_classify_image(
    client: TestClient, checkpoints: dict[str, Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str], png_bytes: Any,
) -> None:  # fmt: skip
    (tmp_path / "a.png").write_bytes(png_bytes(1))
    capsys.readouterr()
    assert main(["classify-image", "--checkpoint", str(checkpoints["vit"]), str(tmp_path / "a.png"),
                 "--top-k", "3"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()[1:]
    r = client.post("/v1/classify", files={"image": ("a.png", png_bytes(1), "image/png")},
                    data={"top_k": "3"})  # fmt: skip
    assert r.status_code == 200, r.text
    got = [f"{x['probability']:.4f}\t{x['label']}" for x in r.json()["labels"][0]]
    assert got == lines


def test_models_health_and_metrics(client: TestClient) -> None:
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    attention = "/v1/attention"
    assert cards["mt"]["family"] == "transformer"
    assert cards["mt"]["endpoints"] == [attention, "/v1/translate"]
    assert cards["lm"]["endpoints"] == [attention, "/v1/completions"]
    assert cards["lm"]["max_input_tokens"] == 40
    assert cards["mlm"]["endpoints"] == [attention, "/v1/embeddings", "/v1/fill-mask"]
    assert cards["cls"]["endpoints"] == [attention, "/v1/classify", "/v1/embeddings"]
    assert cards["vit"]["endpoints"] == ["/v1/classify"]
    assert all(c["parameters"] > 0 for c in cards.values())
    assert client.get("/health").json() == {"status": "ok", "models": 5}
    client.post("/v1/translate", json={"texts": []})
    text = client.get("/metrics").text
    assert 'aiayn_requests_total{endpoint="/v1/translate",status="422"}' in text
    assert 'aiayn_request_errors_total{endpoint="/v1/translate",status="422"}' in text
    for name in (
        "aiayn_request_duration_seconds_bucket",
        "aiayn_queue_depth",
        "aiayn_batch_size_bucket",
        "aiayn_tokens_total",
        "aiayn_tokens_per_second",
    ):
        assert name in text, name
    assert math.isfinite(
        float(text.split('aiayn_tokens_total{kind="output",model="lm"} ')[1].split()[0])
    )
