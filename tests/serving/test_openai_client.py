"""The official ``openai`` Python client against a real server (uvicorn in a thread on a free port
of 127.0.0.1, with a bearer token): completions plain, streamed with a stop string and echoed,
embeddings in the client's default format (base64) and as floats, the model objects and the
errors, every answer equal to what the library (or the CLI) gives for the same input."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from serve_helpers import generated, live_server, lm_and_tokenizer

from aiayn.checkpoint import checkpoint_tokenizer, load_checkpoint
from aiayn.cli.main import main
from aiayn.inference.encoder_tasks import sentence_embeddings
from aiayn.models.bert import BERT

KEY = "s3cret"
PROMPTS = ["the cat", "two men play", "a", "hello world the"]
TEXTS = ["the cat sat on the mat .", "paris is a dog", "a book"]


@pytest.fixture(scope="module")
def base(checkpoints: dict[str, Path], serve_app: Any) -> Iterator[str]:
    """A real server of the LM and the masked-LM BERT, keyed."""
    with live_server(serve_app(checkpoints, ["lm", "mlm"], api_key=KEY).app) as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=60)


def test_completions_equal_generate(client: openai.OpenAI, checkpoints: dict[str, Path]) -> None:
    answer = client.completions.create(model="lm", prompt=PROMPTS, max_tokens=7, user="me")
    assert [c.text for c in answer.choices] == generated(checkpoints, PROMPTS, max_new_tokens=7)
    assert answer.object == "text_completion" and answer.usage is not None
    _, tokenizer = lm_and_tokenizer(checkpoints)
    assert answer.usage.prompt_tokens == sum(len(tokenizer.encode(p)) for p in PROMPTS)
    sampled = client.completions.create(model="lm", prompt=PROMPTS[:2], max_tokens=5,
                                        temperature=0.8, top_p=0.9, seed=5)  # fmt: skip
    expected = generated(checkpoints, PROMPTS[:2], max_new_tokens=5, method="sample",
                          temperature=0.8, top_p=0.9, seed=5)  # fmt: skip
    assert [c.text for c in sampled.choices] == expected


def test_echo_and_token_ids_equal_the_cli(
    client: openai.OpenAI, checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    argv = ["generate", "--checkpoint", str(checkpoints["lm"]), "--max-new-tokens", "6", *PROMPTS]
    assert main(argv) == 0
    printed = capsys.readouterr().out.split("\n")[: len(PROMPTS)]
    echoed = client.completions.create(model="lm", prompt=PROMPTS, max_tokens=6, echo=True)
    assert [c.text for c in echoed.choices] == printed
    _, tokenizer = lm_and_tokenizer(checkpoints)
    ids = [tokenizer.encode(p) for p in PROMPTS]
    by_ids = client.completions.create(model="lm", prompt=ids, max_tokens=6)
    assert [p + c.text for p, c in zip(PROMPTS, by_ids.choices, strict=True)] == printed


def test_a_stream_with_a_stop_string_ends_as_the_answer(
    client: openai.OpenAI, checkpoints: dict[str, Path], stop_that_leaks: Any
) -> None:
    prompt, stop = stop_that_leaks(*lm_and_tokenizer(checkpoints), PROMPTS, 12)
    full = generated(checkpoints, [prompt], max_new_tokens=12)[0]
    whole = client.completions.create(model="lm", prompt=prompt, max_tokens=12, stop=stop)
    assert whole.choices[0].text == full[: full.find(stop)]
    stream = client.completions.create(
        model="lm", prompt=prompt, max_tokens=12, stop=[stop], stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def _embedded(checkpoints: dict[str, Path]) -> torch.Tensor:
    c = load_checkpoint(checkpoints["mlm"], expect=BERT)
    return sentence_embeddings(c.model, checkpoint_tokenizer(c.path), TEXTS)


def test_embeddings_default_base64_and_float_equal_embed(
    client: openai.OpenAI, checkpoints: dict[str, Path]
) -> None:
    default = client.embeddings.create(model="mlm", input=TEXTS)  # sends encoding_format=base64
    floats = client.embeddings.create(model="mlm", input=TEXTS, encoding_format="float")
    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]
    got = torch.tensor([d.embedding for d in floats.data])
    torch.testing.assert_close(got, _embedded(checkpoints), rtol=0, atol=1e-6)
    width = len(floats.data[0].embedding)
    same = client.embeddings.create(model="mlm", input=TEXTS[0], dimensions=width)
    assert same.data[0].embedding == floats.data[0].embedding


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    listed = {m.id: m for m in client.models.list()}
    assert set(listed) == {"lm", "mlm"}
    lm = client.models.retrieve("lm")
    assert lm.id == "lm" and lm.object == "model" and lm.owned_by == "aiayn"
    assert lm.created == listed["lm"].created and lm.created > 1_600_000_000


def test_errors(client: openai.OpenAI, base: str) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="lm", prompt="a", max_tokens=4, presence_penalty=1.0)
    assert bad.value.status_code == 400 and bad.value.param == "presence_penalty"
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model="lm", prompt="a", max_tokens=40)
    assert "the model reads at most 40" in long.value.message
    with pytest.raises(openai.BadRequestError) as cut:
        client.embeddings.create(model="mlm", input="a", dimensions=8)
    assert cut.value.param == "dimensions"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert "no loaded model 'gpt-4'" in missing.value.message
    with pytest.raises(openai.NotFoundError) as chat:
        client.chat.completions.create(model="lm", messages=[{"role": "user", "content": "hi"}])
    assert "chat template" in chat.value.message
    wrong = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
