"""The encoder tasks of ``aiayn serve``: embeddings, text classes and masked tokens (BERT), image
classes (ViT). Their requests are merged under the token budget (:class:`~aiayn.serving.engine.
BatchEngine`) and run through the library functions of ``aiayn embed``, ``classify-text``,
``fill-mask`` and ``classify-image``.

Shape legend:  B texts or images of a batch   C labels   D d_model
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from aiayn.checkpoint import checkpoint_tokenizer
from aiayn.checkpoint.load import Checkpoint
from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.data.images import ImagePreprocessor, check_pixels
from aiayn.errors import UserError
from aiayn.inference.classify_text import classify_texts
from aiayn.inference.encoder import ViTInference
from aiayn.inference.encoder_tasks import fill_mask, sentence_embeddings
from aiayn.inference.packed import pack_for_inference
from aiayn.serving import schemas as s
from aiayn.serving.engine import BatchEngine, Engine, Job
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions
from aiayn.serving.problems import Problem
from aiayn.serving.tasks import Task, too_long

_UNCUT = 1 << 30  # a max_length no text reaches: the tokens before truncation are counted


class BertTask(Task):
    """A BERT task: the model, its tokenizer and the longest input it reads."""

    head: str | None = None  # the head the task needs, None = any

    def __init__(self, name: str, ckpt: Checkpoint[Any], options: ServeOptions, metrics: Metrics):
        self.model = ckpt.model.eval()
        tokenizer = checkpoint_tokenizer(ckpt.path)
        if not isinstance(tokenizer, BertTokenizer):
            raise UserError(f"{ckpt.path} has no BERT vocabulary (bert_tokenizer.json)")
        self.tokenizer = tokenizer
        limit = tokenizer.model_max_length
        self.max_input_tokens = min(limit or self.model.config.max_len, self.model.config.max_len)
        super().__init__(name, options, metrics)

    @classmethod
    def serves(cls, ckpt: Checkpoint[Any]) -> bool:
        """Whether the checkpoint's model has the head this task needs."""
        return cls.head is None or ckpt.model.config.head == cls.head

    def make_engine(self) -> Engine:
        return BatchEngine(self.name, self.options, self.metrics, self.run)

    def count(self, field: str, texts: Sequence[str], pairs: Sequence[str] | None = None) -> int:
        """The tokens of the texts (specials included); 413 for one the model cannot read."""
        total = 0
        for i, text in enumerate(texts):
            pair = None if pairs is None else pairs[i]
            n = len(self.tokenizer.encode(text, pair or None, max_length=_UNCUT).ids)
            if n > self.max_input_tokens:
                raise too_long(f"{field}.{i}", n, self.max_input_tokens)
            total += n
        self.check_tokens(field, total, "the input tokens, summed")
        return total

    def run(self, jobs: Sequence[Job]) -> list[Any]:
        """One batch (subclasses)."""
        raise NotImplementedError


@dataclass(frozen=True)
class TextsJob:
    """Texts (and second texts) of a request and its options."""

    texts: list[str]
    pairs: list[str] | None = None
    top_k: int = 1
    normalize: bool = True


class EmbedTask(BertTask):
    """``/v1/embeddings``: ``aiayn embed``'s vectors (mean pooling, L2-normalised unless
    ``normalize`` is false)."""

    command = "embed"

    def __init__(self, name: str, ckpt: Checkpoint[Any], options: ServeOptions, metrics: Metrics):
        super().__init__(name, ckpt, options, metrics)
        self.packed = pack_for_inference(self.model)  # embed packs (pack=True), once here

    def prepare(self, req: s.EmbeddingRequest) -> Job:
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        cost = self.count("input", texts)
        return self.job(TextsJob(texts, normalize=req.normalize), cost, key=req.normalize)

    def run(self, jobs: Sequence[Job]) -> list[Any]:
        texts = [t for j in jobs for t in j.payload.texts]
        vectors = sentence_embeddings(
            self.packed,
            self.tokenizer,
            texts,
            batch_size=len(texts),
            normalize=jobs[0].payload.normalize,
            pack=False,
        )
        out, start = [], 0
        for job in jobs:
            n = len(job.payload.texts)
            rows = vectors[start : start + n].tolist()
            data = [s.Embedding(index=i, embedding=v) for i, v in enumerate(rows)]
            usage = s.Usage(prompt_tokens=job.cost, total_tokens=job.cost)
            out.append(s.EmbeddingResponse(data=data, model=self.name, usage=usage))
            start += n
        return out


class ClassifyTextTask(BertTask):
    """``/v1/classify`` with texts: ``aiayn classify-text``'s labels."""

    command = "classify-text"
    head = "classification"

    def prepare(self, req: s.ClassifyRequest) -> Job:
        labels = self.model.config.num_labels
        top_k = 1 if req.top_k is None else req.top_k
        if top_k > labels:
            raise Problem(
                422,
                f"top_k must be in 1..{labels} (the model's labels), got {top_k}",
                param="top_k",
            )
        if req.pairs is not None and len(req.pairs) != len(req.texts):
            raise Problem(
                422,
                f"pairs: {len(req.pairs)} second texts for {len(req.texts)} texts",
                param="pairs",
            )
        cost = self.count("texts", req.texts, req.pairs)
        payload = TextsJob(list(req.texts), req.pairs, top_k)
        return self.job(payload, cost, key=req.pairs is not None)

    def run(self, jobs: Sequence[Job]) -> list[Any]:
        texts = [t for j in jobs for t in j.payload.texts]
        pairs = (
            None if jobs[0].payload.pairs is None else [p for j in jobs for p in j.payload.pairs]
        )
        config = self.model.config
        top = classify_texts(
            self.model,
            self.tokenizer,
            texts,
            pairs,
            top_k=config.num_labels,
            batch_size=len(texts),
        )
        names = config.id2label or tuple(str(i) for i in range(config.num_labels))
        out, start = [], 0
        for job in jobs:
            k, n = job.payload.top_k, len(job.payload.texts)
            labels = [
                [s.Label(label=names[i], probability=p) for i, p in row[:k]]
                for row in top[start : start + n]
            ]
            out.append(s.ClassifyResponse(model=self.name, labels=labels))
            start += n
        return out


class FillMaskTask(BertTask):
    """``/v1/fill-mask``: ``aiayn fill-mask``'s predictions (one text at a time, as the library
    computes them; a batch's texts run one after the other)."""

    command = "fill-mask"
    head = "mlm"

    def prepare(self, req: s.FillMaskRequest) -> Job:
        if req.top_k > self.model.config.vocab_size:
            raise Problem(
                422,
                f"top_k must be in 1..{self.model.config.vocab_size}, got {req.top_k}",
                param="top_k",
            )
        cost = self.count("texts", req.texts)
        return self.job(TextsJob(list(req.texts), top_k=req.top_k), cost)

    def run(self, jobs: Sequence[Job]) -> list[Any]:
        out: list[Any] = []
        for job in jobs:
            try:
                found = [
                    self._fill(i, text, job.payload.top_k)
                    for i, text in enumerate(job.payload.texts)
                ]
            except Problem as problem:
                out.append(problem)
                continue
            out.append(s.FillMaskResponse(model=self.name, predictions=found))
        return out

    def _fill(self, i: int, text: str, top_k: int) -> list[list[s.Prediction]]:
        try:
            masks = fill_mask(self.model, self.tokenizer, text, top_k=top_k)
        except UserError as error:
            raise Problem(422, f"texts.{i}: {error}", param=f"texts.{i}") from None
        return [[s.Prediction(**p._asdict()) for p in mask] for mask in masks]


@dataclass(frozen=True)
class ImageJob:
    """An uploaded image's bytes and the labels asked for."""

    data: bytes
    top_k: int


class ClassifyImageTask(Task):
    """``/v1/classify`` with an uploaded image: ``aiayn classify-image``'s labels."""

    command = "classify-image"

    def __init__(self, name: str, ckpt: Checkpoint[Any], options: ServeOptions, metrics: Metrics):
        self.model = ckpt.model.eval()
        config = self.model.config
        if config.num_labels < 1:
            raise UserError(f"{ckpt.path} holds a ViT without a classifier (num_labels = 0)")
        preprocessor = checkpoint_tokenizer(ckpt.path)
        if not isinstance(preprocessor, ImagePreprocessor):
            raise UserError(f"{ckpt.path} has no image preprocessing (preprocessor_config.json)")
        self.preprocessor = preprocessor
        self.runner = ViTInference(self.model)
        self.patches = (config.image_size // config.patch_size) ** 2
        self.max_input_tokens = self.patches + 1
        super().__init__(name, options, metrics)

    @classmethod
    def serves(cls, ckpt: Checkpoint[Any]) -> bool:
        """Every ViT checkpoint (one without a classifier is refused when loaded)."""
        return True

    def make_engine(self) -> Engine:
        return BatchEngine(self.name, self.options, self.metrics, self.run)

    def prepare(self, data: bytes, top_k: int | None) -> Job:
        labels = self.model.config.num_labels
        k = min(5, labels) if top_k is None else top_k
        if not 1 <= k <= labels:
            raise Problem(422, f"top_k must be in 1..{labels}, got {k}", param="top_k")
        if not data:
            raise Problem(422, "image: the uploaded file is empty", param="image")
        return self.job(ImageJob(data, k), self.patches + 1)

    def run(self, jobs: Sequence[Job]) -> list[Any]:
        pixels: list[torch.Tensor | Problem] = [self._pixels(j.payload.data) for j in jobs]
        out: list[Any] = list(pixels)
        shapes = {tuple(p.shape) for p in pixels if isinstance(p, torch.Tensor)}
        for shape in shapes:  # one batch per size (images stored at their size when not resized)
            index = [
                i
                for i, p in enumerate(pixels)
                if isinstance(p, torch.Tensor) and tuple(p.shape) == shape
            ]
            batch = torch.stack([pixels[i] for i in index])  # type: ignore[misc]  # (B, C, H, W)
            with torch.no_grad():
                logits = self.runner(batch.to(next(self.model.parameters()).device)).logits
            assert logits is not None
            probs = torch.softmax(logits.float(), dim=-1)  # (B, C)
            for row, i in enumerate(index):
                out[i] = self._labels(probs[row], jobs[i].payload.top_k)
        return out

    def _labels(self, probs: torch.Tensor, k: int) -> s.ClassifyResponse:
        config = self.model.config
        top = probs.topk(k)
        labels = [
            s.Label(label=config.id2label[i] if config.id2label else str(i), probability=p)
            for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)
        ]
        return s.ClassifyResponse(model=self.name, labels=[labels])

    def _pixels(self, data: bytes) -> torch.Tensor | Problem:
        """The uploaded image, decoded (its size checked from the header first) and
        preprocessed as the checkpoint says; a 422 naming what is wrong."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(data)) as image:
                    check_pixels("image", image.width, image.height)
                    image.load()
                    upright = ImageOps.exif_transpose(image)
            return self.preprocessor.preprocess(upright)
        except Image.DecompressionBombError:
            return Problem(413, "image: too many pixels", param="image")
        except UserError as error:
            return Problem(413 if "pixels" in str(error) else 422, str(error), param="image")
        except UnidentifiedImageError:
            what = "the file is not in an image format Pillow reads (PNG, JPEG, GIF, WebP, ...)"
            return Problem(422, f"image: cannot read the image: {what}", param="image")
        except (OSError, ValueError, SyntaxError) as error:
            return Problem(422, f"image: cannot read the image ({_reason(error)})", param="image")


_STREAM = re.compile(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>")


def _reason(error: BaseException) -> str:
    """Pillow's message for ``error`` on one line, without the repr of the in-memory file it
    read (``<_io.BytesIO object at 0x…>``, which names nothing the client sent)."""
    text = " ".join(_STREAM.sub("", str(error)).split())
    return text or type(error).__name__
