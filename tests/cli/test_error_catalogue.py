"""The catalogue of bad inputs: every command, run through the real entry point
(:func:`aiayn.cli.main.main`), answers a missing, unreadable, truncated or malformed file, a
folder where a file goes (and the reverse), an existing output, or a degenerate input with exit
status 2 and one line ``aiayn CMD: error: …`` naming the problem — never a traceback. argparse's
own errors come after its usage synopsis; the error is then the last line.

Then, per command that writes: an existing output is refused without ``--force`` and replaced
with it, a full disk leaves the old output whole and no temporary behind; and the main entry's
mapping of operating-system errors and of bugs (traceback kept, exit status 1).
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import socket
import stat
import struct
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.config import preset
from aiayn.convert import to_hf
from aiayn.data import Tokenizer
from aiayn.data.bert_tokenizer import BertTokenizer
from aiayn.data.images import ImagePreprocessor
from aiayn.models import Transformer
from aiayn.models.bert import BERT, BertConfig
from aiayn.models.gpt2 import GPT2, GPT2Config
from aiayn.models.vit import ViT, ViTConfig

TEXTS = ["a small dog runs", "the cat sleeps on the mat", "two men play chess", "hello world"]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "."]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random checkpoints of four families: mt (the paper's), gpt2, bert (MLM), vit."""
    root = tmp_path_factory.mktemp("ckpts")
    tokenizer = Tokenizer.train(TEXTS * 20, 300, min_frequency=1)
    tokenizer.save(root / "tok.json")
    torch.manual_seed(0)
    mt = preset(
        "tiny", vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, num_heads=4, max_len=12
    )
    gpt2 = GPT2Config(
        vocab_size=tokenizer.vocab_size, max_len=40, d_model=32, num_heads=4, num_layers=2,
        bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
    )  # fmt: skip
    bert = BertConfig(
        vocab_size=len(WORDS), max_len=32, d_model=32, num_heads=4, num_layers=1, d_ff=64,
        head="mlm",
    )  # fmt: skip
    vit = ViTConfig(
        image_size=16, patch_size=8, d_model=32, num_heads=4, num_layers=1, d_ff=64,
        num_labels=3, id2label=("a", "b", "c"),
    )  # fmt: skip
    vocab = HFTokenizer(models.WordPiece({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    learned = Transformer(mt.replace(positional="learned"))
    hf_bad = to_hf(Transformer(mt), root / "mt_hf_bad", root / "tok.json")
    config = json.loads((hf_bad / "config.json").read_text())
    (hf_bad / "config.json").write_text(json.dumps({**config, "aiayn_positional": "rotary"}))
    return {
        "mt_learned": save_checkpoint(root / "mt_learned", learned, {}, root / "tok.json"),
        "mt_hf_bad": hf_bad,
        "mt": save_checkpoint(root / "mt", Transformer(mt), {"step": 1}, root / "tok.json"),
        "gpt2": save_checkpoint(root / "gpt2", GPT2(gpt2), {"step": 1}, root / "tok.json"),
        "bert": save_checkpoint(root / "bert", BERT(bert), {}, BertTokenizer(vocab)),
        "vit": save_checkpoint(root / "vit", ViT(vit), {}, ImagePreprocessor(size=(16, 16))),
    }


def _bad_files(tmp: Path, ckpts: dict[str, Path]) -> None:
    """The bad (and a few good) inputs every case may name, in ``tmp``."""
    (tmp / "one.txt").write_text("hello world\n")
    (tmp / "two.txt").write_text("a\nb\n")
    (tmp / "empty.txt").write_bytes(b"")
    (tmp / "empty2.txt").write_bytes(b"")
    (tmp / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp / "adir").mkdir()
    (tmp / "bad.json").write_text('{"W_Q": [[1, 2]')
    (tmp / "bad.yaml").write_text("model:\n  d_model: [1\n")
    (tmp / "typo.yaml").write_text("model:\n  d_modle: 3\n")
    (tmp / "zero_heads.yaml").write_text("model:\n  num_heads: 0\n")
    (tmp / "list_section.yaml").write_text("model: [1, 2]\n")
    (tmp / "not_an_image.png").write_text("not a PNG")
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp / "img.png")
    (tmp / "maps").mkdir()
    (tmp / "maps" / "attention.html").write_text("mine")
    (tmp / "nohf").mkdir()
    (tmp / "nohf" / "notes.txt").write_text("mine")
    for name, damage in (
        ("intact", lambda c: None),
        ("truncated", lambda c: _truncate(c / "model.safetensors")),
        ("bad_state", lambda c: (c / "state.json").write_text("{")),
        ("no_tokenizer", lambda c: (c / "tokenizer.json").unlink()),
    ):
        shutil.copytree(ckpts["mt"], tmp / name)
        damage(tmp / name)
    (tmp / "run" / "checkpoints").mkdir(parents=True)


def _no_module(_: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As if CTranslate2 (the ``ct2`` extra) were not installed."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "ctranslate2" else real(name, *args)

    monkeypatch.setattr("aiayn.convert.export.importlib.util.find_spec", find_spec)


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:200])


def _read_only(folder: str) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """Make ``tmp/folder`` read-only as the output checks see it (tests may run as root, for
    whom a chmod changes nothing)."""

    def setup(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        target = tmp / folder
        target.mkdir(exist_ok=True)
        real = os.access

        def access(path: Any, mode: int, **kwargs: Any) -> bool:
            if Path(path) == target and mode & os.W_OK:
                return False
            return real(path, mode, **kwargs)

        monkeypatch.setattr("aiayn.cli.outputs.os.access", access)

    return setup


# -- hostile files: helpers that build them -----------------------------------------------------

_HF_VOCAB = 300  # the byte-level BPE's size


def _hf_gpt2(tmp: Path, name: str = "hf", vocab_size: int = _HF_VOCAB) -> Path:
    """A tiny random Hugging Face GPT-2 folder with its BPE (vocab.json + merges.txt) at
    ``tmp/name``, copied from one built per session beside the test's folder."""
    base = tmp.parent / f"hf-gpt2-{vocab_size}"
    if not base.is_dir():
        from tokenizers import ByteLevelBPETokenizer
        from transformers import GPT2Config as HFGPT2Config
        from transformers import GPT2LMHeadModel

        torch.manual_seed(0)
        config = HFGPT2Config(
            vocab_size=vocab_size, n_positions=32, n_embd=16, n_layer=1, n_head=2,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        building = tmp.parent / f".{base.name}.{os.getpid()}"
        GPT2LMHeadModel(config).save_pretrained(building)
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(
            TEXTS * 20, vocab_size=_HF_VOCAB, min_frequency=1, special_tokens=["<|endoftext|>"]
        )
        bpe.save_model(str(building))
        try:
            os.replace(building, base)
        except OSError:  # another worker built it first
            shutil.rmtree(building)
    shutil.copytree(base, tmp / name)
    return tmp / name


def _hf_edited_config(**changes: Any) -> Callable[[Path, pytest.MonkeyPatch], None]:
    def setup(tmp: Path, _: pytest.MonkeyPatch) -> None:
        config = _hf_gpt2(tmp) / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), **changes}))

    return setup


def _hf_weights_replaced(make: Callable[[Path], Any]) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """The folder with ``model.safetensors`` removed and ``make(path)`` made in its place."""

    def setup(tmp: Path, _: pytest.MonkeyPatch) -> None:
        weights = _hf_gpt2(tmp) / "model.safetensors"
        weights.unlink()
        make(weights)

    return setup


def _hf_poisoned(value: float) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """The folder with one weight of ``transformer.h.0.mlp.c_fc.weight`` set to ``value``."""

    def setup(tmp: Path, _: pytest.MonkeyPatch) -> None:
        from safetensors.torch import load_file, save_file

        weights = _hf_gpt2(tmp) / "model.safetensors"
        tensors = load_file(weights)
        tensors["transformer.h.0.mlp.c_fc.weight"][0, 1] = value
        save_file(tensors, weights, metadata={"format": "pt"})

    return setup


class _Payload:
    """Unpickling this runs ``touch PAYLOAD_RAN`` (in the folder of the inputs)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _hf_bin(kind: str) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """The folder with its weights replaced by a hostile ``pytorch_model.bin``."""

    def setup(tmp: Path, _: pytest.MonkeyPatch) -> None:
        folder = _hf_gpt2(tmp)
        (folder / "model.safetensors").unlink()
        weights = folder / "pytorch_model.bin"
        if kind == "pickle":
            torch.save({"wte.weight": _Payload(tmp / "PAYLOAD_RAN")}, weights)
        else:
            weights.write_bytes({"garbage": bytes(range(256)) * 4, "empty": b""}.get(kind, b"hi"))

    return setup


def _hf_sharded(shard: str, link_out: bool = False) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """The folder sharded: an index mapping every tensor to ``shard`` (``{tmp}``: the inputs'
    folder), with ``model.safetensors`` moved outside the folder; ``link_out``: the shard is a
    link inside the folder to it."""

    def setup(tmp: Path, _: pytest.MonkeyPatch) -> None:
        from safetensors import safe_open

        folder = _hf_gpt2(tmp)
        outside = tmp / "elsewhere.safetensors"
        (folder / "model.safetensors").rename(outside)
        with safe_open(str(outside), "pt") as weights:
            names = list(weights.keys())
        name = shard.format(tmp=tmp)
        if link_out:
            (folder / name).symlink_to(outside)
        index = {"metadata": {}, "weight_map": dict.fromkeys(names, name)}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    return setup


def _huge_png(name: str) -> Callable[[Path, pytest.MonkeyPatch], None]:
    def setup(tmp: Path, _: pytest.MonkeyPatch) -> None:
        png_header(tmp / name, 12000, 12000)

    return setup


def png_header(path: Path, width: int, height: int) -> None:
    """A PNG of a few dozen bytes whose header claims ``width`` × ``height`` 1-bit pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def _full_device(tmp: Path, _: pytest.MonkeyPatch) -> None:
    """``tmp/full``: a device node like ``/dev/full`` (every write fails: disk full) where the
    tests may create one (as root), else a link to ``/dev/full`` — never the system's own node,
    which a regression would replace."""
    try:
        os.mknod(tmp / "full", 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except PermissionError:
        (tmp / "full").symlink_to("/dev/full")


def _link(name: str, target: str) -> Callable[[Path, pytest.MonkeyPatch], None]:
    def setup(tmp: Path, _: pytest.MonkeyPatch) -> None:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).symlink_to(target)

    return setup


def _socket(name: str) -> Callable[[Path, pytest.MonkeyPatch], None]:
    def setup(tmp: Path, _: pytest.MonkeyPatch) -> None:
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(tmp / name))

    return setup


def _blank_lines(tmp: Path, _: pytest.MonkeyPatch) -> None:
    (tmp / "masks.txt").write_text("the [MASK]\n\n   \nthe mat\n")


@dataclass(frozen=True)
class Case:
    """``argv`` ({mt}, {gpt2}, {bert}, {vit}: the checkpoints; {tmp}: the bad inputs), the exit
    status and a fragment of the message; ``setup`` prepares more."""

    argv: str
    status: int
    fragment: str
    setup: Callable[[Path, pytest.MonkeyPatch], None] | None = None


def _quantised(tmp: Path, _: pytest.MonkeyPatch) -> None:
    """``{tmp}/q8``: the translation checkpoint, int8 (aiayn quantize); ``{tmp}/q8gpt2``: a
    GPT-2, int8."""
    from aiayn.checkpoint import load_checkpoint
    from aiayn.inference.quantize import quantize_model

    ckpt = load_checkpoint(tmp / "intact", quantize="int8")
    save_checkpoint(tmp / "q8", ckpt.model, {}, tmp / "intact" / "tokenizer.json")
    config = GPT2Config(300, 8, 16, 2, 1, bos_id=0, eos_id=0, pad_id=0)
    gpt2 = quantize_model(GPT2(config))
    save_checkpoint(tmp / "q8gpt2", gpt2, {}, tmp / "intact" / "tokenizer.json")


def _quantised_nan_scale(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``{tmp}/q8`` (:func:`_quantised`) with one scale of its decoder's first cross-attention
    NaN, the edit recorded in ``SHA256SUMS``."""
    from safetensors.torch import load_file

    from aiayn.checkpoint import record_checksums, save_safetensors

    _quantised(tmp, monkeypatch)
    tensors = load_file(str(tmp / "q8" / "model.safetensors"))
    tensors["decoder.layers.0.cross_attn.in_proj.scales"][7] = float("nan")
    save_safetensors(tensors, tmp / "q8" / "model.safetensors", {"format": "pt"})
    record_checksums(tmp / "q8")


# -- hostile files: checkpoints, run folders, bounds: helpers ----------------------------------


def _hostile_ckpt(damage: Callable[[Path], Any]) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """A copy of the intact translation checkpoint, ``{tmp}/hostile``, with ``damage`` done."""

    def setup(tmp: Path, _: pytest.MonkeyPatch) -> None:
        shutil.copytree(tmp / "intact", tmp / "hostile")
        damage(tmp / "hostile")

    return setup


def _drop_sum_line(name: str) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        sums = folder / "SHA256SUMS"
        lines = sums.read_text().splitlines(keepends=True)
        sums.write_text("".join(x for x in lines if not x.rstrip().endswith(f"  {name}")))

    return damage


def _add_sum_line(name: str) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        with open(folder / "SHA256SUMS", "a") as sums:
            sums.write(f"{'0' * 64}  {name}\n")

    return damage


def _replace_weights(make: Callable[[Path], Any]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        (folder / "model.safetensors").unlink()
        make(folder / "model.safetensors")

    return damage


def _state_field(key: str, value: Any) -> Callable[[Path], None]:
    """``state.json[key] = value``, recorded in SHA256SUMS (so only the type is wrong)."""

    def damage(folder: Path) -> None:
        from aiayn.checkpoint import record_checksums

        state = json.loads((folder / "state.json").read_text())
        state[key] = value
        (folder / "state.json").write_text(json.dumps(state))
        record_checksums(folder)

    return damage


def _tuned_beam(beam: Any) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        tuned = {"alpha": 0.6, "beam_size": beam, "length_penalty": "gnmt", "source": "v.src",
                 "reference": "v.ref", "sentences": 2, "scores": {}}  # fmt: skip
        (folder / "tuned_alpha.json").write_text(json.dumps(tuned))

    return damage


class _Held:
    """Open files the monkeypatch holds for one case (closed when it is undone)."""

    files: ClassVar[list[Any]] = []


def _locked_run(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``{tmp}/run`` holding a run's tokenizer, its lock held by this process (pid written)."""
    import fcntl

    run = tmp / "run"
    (run / "tokenizer.json").write_text("{}")
    lock = open(run / "run.lock", "a+")  # noqa: SIM115 - held until the case ends
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    monkeypatch.setattr(_Held, "files", [lock])


def _short_lm_text(tmp: Path, _: pytest.MonkeyPatch) -> None:
    (tmp / "lm.txt").write_text("hello world\nthe cat sat\n")


def _finetune(family: str, small_vocab: bool = False) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """``{tmp}/ft.yaml``: a translation run of ``family`` on ``{tmp}/pairs.tsv`` naming no
    preset (the command line adds ``model.init_from``); ``small_vocab``: also
    ``{tmp}/small_vocab``, a checkpoint whose embeddings lack rows for 10 of its tokenizer's ids."""

    def setup(tmp: Path, _: pytest.MonkeyPatch) -> None:
        (tmp / "pairs.tsv").write_text("".join(f"{t}\t{t}\n" for t in TEXTS * 3))
        values = {
            "run_dir": "runs/ft",
            "model": {"family": family},
            "data": {"train_src": str(tmp / "pairs.tsv"), "valid_size": 2},
            "train": {"max_steps": 1, "progress": False},
        }
        (tmp / "ft.yaml").write_text(json.dumps(values))  # JSON is YAML
        if small_vocab:
            tokenizer = Tokenizer.train(TEXTS * 20, 300, min_frequency=1)
            tokenizer.save(tmp / "tok.json")
            config = preset("tiny", vocab_size=tokenizer.vocab_size - 10, d_model=32, d_ff=64)
            model = Transformer(config.replace(num_heads=4))
            save_checkpoint(tmp / "small_vocab", model, {}, tmp / "tok.json")
            (tmp / "tok.json").unlink()

    return setup


_MANY_WORDS = " ".join(["w"] * 20_000)


CASES = {
    # -- train: run configs ---------------------------------------------------------------------
    "train/missing config": Case("train --config {tmp}/nope.yaml", 2, "config file not found"),
    "train/config is a folder": Case("train --config {tmp}/adir", 2, "{tmp}/adir"),
    "train/malformed YAML": Case(
        "train --config {tmp}/bad.yaml", 2, "bad.yaml: not valid YAML: line 3, column 1: expected"
    ),
    "train/config not UTF-8": Case("train --config {tmp}/latin1.txt", 2, "not valid UTF-8"),
    "train/empty config": Case("train --config {tmp}/empty.txt", 2, "expected a mapping"),
    "train/unknown key": Case("train --config {tmp}/typo.yaml", 2, "d_modle"),
    "train/bad value": Case("train --config {tmp}/zero_heads.yaml", 2, "num_heads"),
    "train/section not a mapping": Case(
        "train --config {tmp}/list_section.yaml", 2, "section 'model' must be a mapping"
    ),
    "train/--set without =": Case("train --set foo", 2, "--set expects section.key=value"),
    "train/--set wrong type": Case("train --set train.max_steps=abc", 2, "train.max_steps"),
    "train/--set unknown": Case("train --set nope.key=1", 2, "unknown top-level config key"),
    "train/config and demo": Case("train --config {tmp}/one.txt --demo lm", 2, "not both"),
    "train/unknown demo": Case("train --demo nope", 2, "invalid choice: 'nope'"),
    "train/init_from another family's checkpoint": Case(
        "train --config {tmp}/ft.yaml --set model.init_from={gpt2}",
        2,
        "holds a gpt2 model, not transformer (set model.family: gpt2)",
        _finetune("transformer"),
    ),
    "train/init_from and a model vocab_size": Case(
        "train --config {tmp}/ft.yaml --set model.init_from={mt} --set model.vocab_size=500",
        2,
        "model.vocab_size=500 differs from the",
        _finetune("transformer"),
    ),
    "train/init_from and a data vocab_size": Case(
        "train --config {tmp}/ft.yaml --set model.init_from={mt} --set data.vocab_size=500",
        2,
        "data.vocab_size does not apply with model.init_from",
        _finetune("transformer"),
    ),
    "train/t5 without init_from": Case(
        "train --config {tmp}/ft.yaml",
        2,
        "family t5 trains only from a checkpoint: set model.init_from",
        _finetune("t5"),
    ),
    "train/init_from whose tokenizer outgrows its model": Case(
        "train --config {tmp}/ft.yaml --set model.init_from={tmp}/small_vocab",
        2,
        "model.init_from: the tokenizer of {tmp}/small_vocab has",
        _finetune("transformer", small_vocab=True),
    ),
    # -- translate ------------------------------------------------------------------------------
    "translate/missing checkpoint": Case(
        "translate --checkpoint {tmp}/nope -i {tmp}/one.txt", 2, "no checkpoint found"
    ),
    "translate/checkpoint is a file": Case(
        "translate --checkpoint {tmp}/one.txt -i {tmp}/one.txt", 2, "no checkpoint found"
    ),
    "translate/truncated weights": Case(
        "translate --checkpoint {tmp}/truncated -i {tmp}/one.txt", 2, "model.safetensors"
    ),
    "translate/malformed state.json": Case(
        "translate --checkpoint {tmp}/bad_state -i {tmp}/one.txt", 2, "state.json"
    ),
    "translate/no tokenizer": Case(
        "translate --checkpoint {tmp}/no_tokenizer -i {tmp}/one.txt", 2, "tokenizer.json"
    ),
    "translate/language model": Case(
        "translate --checkpoint {gpt2} -i {tmp}/one.txt", 2, "holds a gpt2 model"
    ),
    "translate/missing input": Case(
        "translate --checkpoint {mt} -i {tmp}/nope.txt", 2, "not found: {tmp}/nope.txt"
    ),
    "translate/input is a folder": Case(
        "translate --checkpoint {mt} -i {tmp}/adir", 2, "not a file: {tmp}/adir"
    ),
    "translate/input not UTF-8": Case(
        "translate --checkpoint {mt} -i {tmp}/latin1.txt", 2, "line 1: not valid UTF-8"
    ),
    "translate/output is a folder": Case(
        "translate --checkpoint {mt} -i {tmp}/one.txt -o {tmp}/adir", 2, "is a folder"
    ),
    "translate/output exists": Case(
        "translate --checkpoint {mt} -i {tmp}/one.txt -o {tmp}/two.txt", 2, "pass --force"
    ),
    "translate/output under a file": Case(
        "translate --checkpoint {mt} -i {tmp}/one.txt -o {tmp}/one.txt/out.txt",
        2,
        "{tmp}/one.txt is not a folder",
    ),
    "translate/read-only output folder": Case(
        "translate --checkpoint {mt} -i {tmp}/one.txt -o {tmp}/ro/out.txt",
        2,
        "cannot write in {tmp}/ro",
        _read_only("ro"),
    ),
    "translate/beam 0": Case(
        "translate --checkpoint {mt} --beam 0", 2, "must be in [1, 1000], got 0"
    ),
    "translate/unknown device": Case(
        "translate --checkpoint {mt} --device foo", 2, "unknown device 'foo'"
    ),
    # -- evaluate -------------------------------------------------------------------------------
    "evaluate/two empty files": Case(
        "evaluate --hyp {tmp}/empty.txt --ref {tmp}/empty2.txt", 2, "no references"
    ),
    "evaluate/line counts differ": Case(
        "evaluate --hyp {tmp}/one.txt --ref {tmp}/two.txt", 2, "1 hypotheses but 2 references"
    ),
    "evaluate/missing hypotheses": Case(
        "evaluate --hyp {tmp}/nope.txt --ref {tmp}/one.txt", 2, "not found"
    ),
    "evaluate/references not UTF-8": Case(
        "evaluate --hyp {tmp}/one.txt --ref {tmp}/latin1.txt", 2, "not valid UTF-8"
    ),
    "evaluate/hypotheses are a folder": Case(
        "evaluate --hyp {tmp}/adir --ref {tmp}/one.txt", 2, "not a file"
    ),
    "evaluate/no references": Case("evaluate --hyp {tmp}/one.txt", 2, "give --ref FILE"),
    "evaluate/hyp and checkpoint": Case(
        "evaluate --hyp {tmp}/one.txt --ref {tmp}/one.txt --checkpoint {mt}", 2, "not both"
    ),
    "evaluate/sources and references differ": Case(
        "evaluate --checkpoint {mt} --src {tmp}/two.txt --ref {tmp}/one.txt",
        2,
        "2 source lines",
    ),
    "evaluate/hypotheses file exists": Case(
        "evaluate --checkpoint {mt} --src {tmp}/one.txt --ref {tmp}/one.txt --hyp-out "
        "{tmp}/two.txt",
        2,
        "{tmp}/two.txt exists: pass --force",
    ),
    "evaluate/perplexity of a translation model": Case(
        "evaluate --checkpoint {mt} --text {tmp}/one.txt", 2, "holds a transformer model"
    ),
    "evaluate/perplexity of an empty text": Case(
        "evaluate --checkpoint {gpt2} --text {tmp}/empty.txt", 2, "empty"
    ),
    "evaluate/text and references": Case(
        "evaluate --checkpoint {gpt2} --text {tmp}/one.txt --ref {tmp}/one.txt", 2, "--ref"
    ),
    "evaluate/block size without text": Case(
        "evaluate --hyp {tmp}/one.txt --ref {tmp}/one.txt --block-size 4", 2, "--block-size"
    ),
    # -- average --------------------------------------------------------------------------------
    "average/no checkpoints": Case("average --out {tmp}/avg", 2, "give checkpoint folders"),
    "average/empty run": Case(
        "average --run-dir {tmp}/run --out {tmp}/avg", 2, "no checkpoints under"
    ),
    "average/different models": Case(
        "average {mt} {gpt2} --out {tmp}/avg", 2, "different model config"
    ),
    "average/truncated weights": Case(
        "average {tmp}/truncated {mt} --out {tmp}/avg", 2, "model.safetensors"
    ),
    "average/missing checkpoint": Case(
        "average {tmp}/nope {mt} --out {tmp}/avg", 2, "no checkpoint found"
    ),
    "average/a checkpoint given twice": Case(
        "average {mt} {mt}/. --out {tmp}/avg", 2, "is given twice"
    ),
    "average/run folder and checkpoints": Case(
        "average {mt} --run-dir {tmp}/run --out {tmp}/avg", 2, "not both"
    ),
    "average/a Hugging Face folder": Case(
        "average {tmp}/hf --out {tmp}/avg",
        2,
        "is a Hugging Face model folder, not an aiayn checkpoint: convert it first",
        lambda tmp, _: (tmp / "hf").mkdir() or (tmp / "hf" / "config.json").write_text("{}"),
    ),
    "average/output exists": Case("average {mt} --out {gpt2}", 2, "exists: pass --force"),
    "average/force over a folder of other files": Case(
        "average {mt} --out {tmp}/nohf --force", 2, "not an aiayn checkpoint"
    ),
    "average/force over a file": Case(
        "average {mt} --out {tmp}/one.txt --force", 2, "is a file, not an aiayn checkpoint"
    ),
    "average/into a run's checkpoints": Case(
        "average {mt} --out {tmp}/run/checkpoints/step_00000009", 2, "pass --force"
    ),
    "average/read-only folder": Case(
        "average {mt} --out {tmp}/ro/avg", 2, "cannot write in {tmp}/ro", _read_only("ro")
    ),
    # -- attention ------------------------------------------------------------------------------
    "attention/missing checkpoint": Case(
        "attention --checkpoint {tmp}/nope --src hi", 2, "checkpoint not found"
    ),
    "attention/empty sentence": Case(
        "attention --checkpoint {mt} --src '  ' --out {tmp}/m", 2, "--src is empty"
    ),
    "attention/image for a translation model": Case(
        "attention --checkpoint {mt} --image {tmp}/img.png", 2, "--image is for ViT checkpoints"
    ),
    "attention/sentence for a ViT": Case(
        "attention --checkpoint {vit} --src hi", 2, "--src is for Transformer or T5 checkpoints"
    ),
    "attention/ViT without image": Case("attention --checkpoint {vit}", 2, "give --image"),
    "attention/missing image": Case(
        "attention --checkpoint {vit} --image {tmp}/nope.png --out {tmp}/m",
        2,
        "cannot read the image",
    ),
    "attention/not an image": Case(
        "attention --checkpoint {vit} --image {tmp}/not_an_image.png --out {tmp}/m",
        2,
        "cannot read the image",
    ),
    "attention/out is a file": Case(
        "attention --checkpoint {mt} --src hi --out {tmp}/one.txt", 2, "is not a folder"
    ),
    "attention/out holds maps": Case(
        "attention --checkpoint {mt} --src hi --out {tmp}/maps", 2, "already holds attention.html"
    ),
    "attention/sentence too long to draw": Case(
        "attention --checkpoint {mt} --src '" + "cat " * 200 + "' --out {tmp}/m",
        2,
        "more than --max-tokens 160",
    ),
    "attention/max-tokens 0": Case(
        "attention --checkpoint {mt} --src hi --max-tokens 0 --out {tmp}/m", 2, "--max-tokens"
    ),
    "attention/language model given --src": Case(
        "attention --checkpoint {gpt2} --src hi --out {tmp}/m", 2, "holds a gpt2 model: give --text"
    ),
    "attention/--tgt for a language model": Case(
        "attention --checkpoint {gpt2} --text hi --tgt x --out {tmp}/m",
        2,
        "--tgt does not apply here",
    ),
    "attention/--continue for BERT": Case(
        "attention --checkpoint {bert} --text hi --continue 3 --out {tmp}/m",
        2,
        "--continue does not apply here",
    ),
    "attention/--continue below 0": Case(
        "attention --checkpoint {gpt2} --text hi --continue -1 --out {tmp}/m", 2, "--continue"
    ),
    "attention/empty text": Case(
        "attention --checkpoint {bert} --text '  ' --out {tmp}/m", 2, "--text is empty"
    ),
    "attention/prompt past the positions": Case(
        "attention --checkpoint {gpt2} --text hi --continue 100000 --out {tmp}/m",
        2,
        "this model's limit is",
    ),
    "attention/bias of a model without one": Case(
        "attention --checkpoint {mt} --bias {tmp}/b.png", 2, "no learned relative position bias"
    ),
    "attention/bias-reach without bias": Case(
        "attention --checkpoint {mt} --bias-reach 3", 2, "--bias-reach needs --bias"
    ),
    # -- explain --------------------------------------------------------------------------------
    "explain/missing weights": Case(
        "explain --weights {tmp}/nope.json", 2, "cannot read weights file"
    ),
    "explain/malformed JSON": Case("explain --weights {tmp}/bad.json", 2, "not valid JSON"),
    "explain/weights not UTF-8": Case(
        "explain --weights {tmp}/latin1.txt", 2, "cannot read weights file"
    ),
    "explain/weights are a folder": Case("explain --weights {tmp}/adir", 2, "Is a directory"),
    "explain/no tokens": Case("explain --tokens ''", 2, "no tokens"),
    "explain/heads do not divide": Case("explain --heads 3", 2, "does not divide d_model"),
    "explain/missing checkpoint": Case(
        "explain --checkpoint {tmp}/nope", 2, "checkpoint not found"
    ),
    "explain/text without checkpoint": Case("explain --text hi", 2, "--text needs --checkpoint"),
    "explain/toy option with checkpoint": Case(
        "explain --checkpoint {mt} --seed 1", 2, "--seed is for the small example"
    ),
    "explain/image for a text model": Case(
        "explain --checkpoint {gpt2} --image {tmp}/img.png", 2, "--image needs a ViT"
    ),
    "explain/ViT without image": Case("explain --checkpoint {vit}", 2, "give --image"),
    "explain/not an image": Case(
        "explain --checkpoint {vit} --image {tmp}/not_an_image.png", 2, "not_an_image.png"
    ),
    "explain/empty text": Case("explain --checkpoint {bert} --text '  '", 2, "--text is empty"),
    "explain/head out of range": Case(
        "explain --checkpoint {mt} --head 9", 2, "--head 9 is not a head"
    ),
    "explain/too many tokens": Case(
        "explain --checkpoint {gpt2} --text '" + "cat " * 100 + "'", 2, "more than explain traces"
    ),
    # -- generate, fill-mask, embed, classify-image ----------------------------------------------
    "generate/translation model": Case(
        "generate --checkpoint {mt} hi", 2, "holds a transformer model"
    ),
    "generate/missing prompts file": Case(
        "generate --checkpoint {gpt2} -i {tmp}/nope.txt", 2, "not found"
    ),
    "generate/prompts twice": Case(
        "generate --checkpoint {gpt2} -i {tmp}/one.txt hi", 2, "not both"
    ),
    "generate/sampling option without sampling": Case(
        "generate --checkpoint {gpt2} --top-p 0.5 hi", 2, "--top-p applies to --sample only"
    ),
    "fill-mask/language model": Case(
        "fill-mask --checkpoint {gpt2} 'the [MASK]'", 2, "holds a gpt2 model"
    ),
    "fill-mask/no mask": Case("fill-mask --checkpoint {bert} 'the cat'", 2, "no [MASK]"),
    "fill-mask/input not UTF-8": Case(
        "fill-mask --checkpoint {bert} -i {tmp}/latin1.txt", 2, "not valid UTF-8"
    ),
    "embed/similarity and input": Case(
        "embed --checkpoint {bert} --similarity {tmp}/one.txt {tmp}/one.txt -i {tmp}/one.txt",
        2,
        "--similarity reads its two files",
    ),
    "embed/output exists": Case(
        "embed --checkpoint {bert} -i {tmp}/one.txt --out {tmp}/two.txt", 2, "pass --force"
    ),
    "embed/output is a folder": Case(
        "embed --checkpoint {bert} -i {tmp}/one.txt --out {tmp}/adir", 2, "is a folder"
    ),
    "embed/unknown device": Case(
        "embed --checkpoint {bert} -i {tmp}/one.txt --device gpu", 2, "unknown device 'gpu'"
    ),
    "embed/similarity of unequal files": Case(
        "embed --checkpoint {bert} --similarity {tmp}/one.txt {tmp}/two.txt",
        2,
        "need as many texts",
    ),
    "classify-image/missing image": Case(
        "classify-image --checkpoint {vit} {tmp}/nope.png", 2, "cannot read the image"
    ),
    "classify-image/not an image": Case(
        "classify-image --checkpoint {vit} {tmp}/not_an_image.png", 2, "cannot read the image"
    ),
    "classify-image/translation model": Case(
        "classify-image --checkpoint {mt} {tmp}/img.png", 2, "holds a transformer model"
    ),
    "classify-image/top-k above the labels": Case(
        "classify-image --checkpoint {vit} {tmp}/img.png --top-k 9", 2, "--top-k"
    ),
    # -- serve (refused before anything is served) ------------------------------------------
    "serve/missing checkpoint": Case("serve --checkpoint {tmp}/nope --port 0", 2, "{tmp}/nope"),
    "serve/bad model name": Case("serve --checkpoint 'a b={mt}' --port 0", 2, "model name 'a b'"),
    "serve/name given twice": Case(
        "serve --checkpoint x={mt} --checkpoint x={mt} --port 0", 2, "'x' is given twice"
    ),
    "serve/port out of range": Case("serve --checkpoint {mt} --port 70000", 2, "--port"),
    "serve/negative wait": Case("serve --checkpoint {mt} --max-wait-ms -1", 2, "--max-wait-ms"),
    "serve/zero queue": Case("serve --checkpoint {mt} --queue-size 0", 2, "--queue-size"),
    "serve/too many decode workers": Case(
        "serve --checkpoint {mt} --decode-workers 65", 2, "--decode-workers"
    ),
    "serve/tiny body limit": Case(
        "serve --checkpoint {mt} --max-body-bytes 10", 2, "--max-body-bytes"
    ),
    "serve/unknown host": Case(
        "serve --checkpoint {mt} --host no.such.host.invalid --port 0", 2, "--host"
    ),
    # -- quantize, and the fp32-only commands given a quantised checkpoint ------------------------
    "quantize/output exists": Case(
        "quantize --checkpoint {mt} --out {gpt2}", 2, "exists: pass --force"
    ),
    "quantize/force over a folder of other files": Case(
        "quantize --checkpoint {mt} --out {tmp}/nohf --force", 2, "not an aiayn checkpoint"
    ),
    "quantize/missing checkpoint": Case(
        "quantize --checkpoint {tmp}/nope --out {tmp}/q", 2, "no checkpoint found"
    ),
    "quantize/already quantised": Case(
        "quantize --checkpoint {tmp}/q8 --out {tmp}/q", 2, "is already int8-quantised", _quantised
    ),
    "quantize/onto itself": Case(
        "quantize --checkpoint {mt} --out {mt} --force", 2, "is the checkpoint itself"
    ),
    "translate/unknown quantisation": Case(
        "translate --checkpoint {mt} --quantize int4", 2, "invalid choice: 'int4'"
    ),
    "average/a quantised checkpoint": Case(
        "average {tmp}/q8 {mt} --out {tmp}/avg",
        2,
        "{tmp}/q8 holds an int8-quantised model; averaging needs fp32 weights",
        _quantised,
    ),
    "convert/a quantised checkpoint back to Hugging Face": Case(
        "convert --checkpoint {tmp}/q8gpt2 --to-hf {tmp}/out",
        2,
        "{tmp}/q8gpt2 holds an int8-quantised model; convert --to-hf needs fp32 weights",
        _quantised,
    ),
    "translate/a quantised checkpoint with a NaN scale": Case(
        "translate --checkpoint {tmp}/q8 --input {tmp}/one.txt",
        2,
        "model.safetensors: decoder.layers.0.cross_attn.in_proj.scales: 1 of 96 scales are not "
        "finite and > 0 (row 7: nan)",
        _quantised_nan_scale,
    ),
    "export/a quantised checkpoint to CTranslate2": Case(
        "export --checkpoint {tmp}/q8 --to ct2 {tmp}/e",
        2,
        "{tmp}/q8 holds an int8-quantised model (aiayn quantize); aiayn export reads fp32 "
        "checkpoints only: export the fp32 checkpoint it was quantised from with --to ct2 "
        "--quantization int8",
        _quantised,
    ),
    # -- convert, params, experiment ------------------------------------------------------------
    "convert/no direction": Case("convert --from-hf {tmp}/adir", 2, "give --from-hf"),
    "convert/missing folder": Case(
        "convert --from-hf {tmp}/nope --to {tmp}/c", 2, "{tmp}/nope: no such folder"
    ),
    "convert/a file": Case(
        "convert --from-hf {tmp}/one.txt --to {tmp}/c", 2, "not a Hugging Face model folder"
    ),
    "convert/folder without config.json": Case(
        "convert --from-hf {tmp}/adir --to {tmp}/c", 2, "config.json"
    ),
    "convert/destination exists": Case(
        "convert --from-hf {tmp}/adir --to {tmp}/nohf", 2, "exists: pass --force"
    ),
    "export/family without a CTranslate2 exporter": Case(
        "export --checkpoint {vit} --to ct2 {tmp}/e", 2, "a vit model cannot be exported to CTr"
    ),
    "export/family without an ONNX exporter": Case(
        "export --checkpoint {gpt2} --to onnx {tmp}/e", 2, "a gpt2 model cannot be exported to ONNX"
    ),
    "export/destination exists": Case(
        "export --checkpoint {mt} --to ct2 {tmp}/adir", 2, "adir exists: aiayn export never"
    ),
    "export/quantization of an ONNX export": Case(
        "export --checkpoint {bert} --to onnx {tmp}/e --quantization int8", 2, "is for --to ct2"
    ),
    "export/unknown quantization": Case(
        "export --checkpoint {mt} --to ct2 {tmp}/e --quantization int4", 2, "invalid choice"
    ),
    "export/missing checkpoint": Case("export --checkpoint {tmp}/nope --to ct2 {tmp}/e", 2, "nope"),
    "export/extra not installed": Case(
        "export --checkpoint {mt} --to ct2 {tmp}/e", 2, "pip install 'aiayn[ct2]'", _no_module
    ),
    "convert/a model no transformers class computes": Case(
        "convert --checkpoint {mt_learned} --to-hf {tmp}/c",
        2,
        "positional='learned' has no transformers encoder-decoder class",
    ),
    "convert/to-hf destination exists": Case(
        "convert --checkpoint {mt} --to-hf {tmp}/nohf", 2, "exists: pass --force"
    ),
    "convert/unknown aiayn_positional": Case(
        "convert --from-hf {mt_hf_bad} --to {tmp}/c",
        2,
        "aiayn_positional=\"rotary\" is not 'sinusoidal'",
    ),
    "convert/force over a folder of other files": Case(
        "convert --checkpoint {gpt2} --to-hf {tmp}/nohf --force",
        2,
        "not a Hugging Face model folder",
    ),
    "params/unknown preset": Case("params --preset nope", 2, "invalid choice: 'nope'"),
    "params/vocabulary of 0": Case("params --vocab-size 0", 2, "vocab"),
    "experiment/unknown": Case("experiment nope", 2, "unknown experiment 'nope'"),
    "experiment/no name": Case("experiment", 2, "name an experiment"),
    "experiment/out is a file": Case(
        "experiment scaling --out {tmp}/one.txt", 2, "exists and is not a folder"
    ),
    "experiment/out holds its files": Case(
        "experiment scaling --out {tmp}/exp",
        2,
        "already holds scaling.md",
        lambda tmp, _: (tmp / "exp").mkdir() or (tmp / "exp" / "scaling.md").write_text("x"),
    ),
    # -- hostile files: Hugging Face folders, outputs, inputs --------------------------------
    "convert/config field of the wrong type": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "config.json: vocab_size='400' has the wrong type (expected an integer)",
        _hf_edited_config(vocab_size="400"),
    ),
    "convert/config flag of the wrong type": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "config.json: tie_word_embeddings='yes' has the wrong type (expected true or false)",
        _hf_edited_config(tie_word_embeddings="yes"),
    ),
    "convert/NaN weight": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "model.safetensors: tensor 'transformer.h.0.mlp.c_fc.weight' holds NaN or infinite",
        _hf_poisoned(float("nan")),
    ),
    "convert/infinite weight": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "tensor 'transformer.h.0.mlp.c_fc.weight' holds NaN or infinite values",
        _hf_poisoned(float("-inf")),
    ),
    "convert/garbage pytorch_model.bin": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "pytorch_model.bin: cannot read the weights (not a PyTorch weights file)",
        _hf_bin("garbage"),
    ),
    "convert/empty pytorch_model.bin": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "pytorch_model.bin: cannot read the weights (empty or truncated)",
        _hf_bin("empty"),
    ),
    "convert/text pytorch_model.bin": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "pytorch_model.bin: cannot read the weights (not a PyTorch weights file)",
        _hf_bin("text"),
    ),
    "convert/pickle payload in pytorch_model.bin": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "holds pickled code or objects other than tensors (posix.system), which aiayn never runs",
        _hf_bin("pickle"),
    ),
    "convert/shard index with ..": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "shard '../elsewhere.safetensors' is not a file name inside the folder",
        _hf_sharded("../elsewhere.safetensors"),
    ),
    "convert/shard index with an absolute path": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "is not a file name inside the folder",
        _hf_sharded("{tmp}/elsewhere.safetensors"),
    ),
    "convert/shard index naming /etc/passwd": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "shard '../../etc/passwd' is not a file name inside the folder",
        _hf_sharded("../../etc/passwd"),
    ),
    "convert/shard linked out of the folder": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "model-00001-of-00001.safetensors: the shard leads out of the folder",
        _hf_sharded("model-00001-of-00001.safetensors", link_out=True),
    ),
    "convert/weights linked to /dev/zero": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "model.safetensors: the weights file leads out of the folder (to /dev/zero)",
        _hf_weights_replaced(lambda weights: weights.symlink_to("/dev/zero")),
    ),
    "convert/weights are a FIFO": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "model.safetensors: the weights file is not a regular file",
        _hf_weights_replaced(os.mkfifo),
    ),
    "convert/tokenizer larger than the vocabulary": Case(
        "convert --from-hf {tmp}/hf --to {tmp}/c",
        2,
        "the tokenizer has 300 tokens but the model's vocabulary has 200",
        lambda tmp, _: _hf_gpt2(tmp, vocab_size=200) and None,
    ),
    "embed/--force over a full device": Case(
        "embed --checkpoint {bert} -i {tmp}/one.txt --out {tmp}/full --force",
        2,
        "cannot write {tmp}/full: ",  # No space left on device (or a nodev mount's refusal)
        _full_device,
    ),
    "embed/output a link to nothing": Case(
        "embed --checkpoint {bert} -i {tmp}/one.txt --out {tmp}/dangling --force",
        2,
        "--out {tmp}/dangling is a symbolic link to nothing",
        _link("dangling", "nowhere.npy"),
    ),
    "translate/output a socket": Case(
        "translate --checkpoint {mt} -i {tmp}/one.txt -o {tmp}/sock --force",
        2,
        "--output {tmp}/sock is a socket: aiayn writes regular files, FIFOs and character devices",
        _socket("sock"),
    ),
    "average/--force over a link to a checkpoint": Case(
        "average {mt} --out {tmp}/linked --force",
        2,
        "--out {tmp}/linked is a symbolic link: --force replaces only an aiayn checkpoint",
        _link("linked", "truncated"),
    ),
    "attention/--force over a link among its files": Case(
        "attention --checkpoint {mt} --src hi --out {tmp}/links --no-png --force",
        2,
        "{tmp}/links/attention.html is a symbolic link: --force replaces only regular files",
        _link("links/attention.html", "../one.txt"),
    ),
    "fill-mask/a line without a mask, after blank lines": Case(
        "fill-mask --checkpoint {bert} -i {tmp}/masks.txt",
        2,
        "{tmp}/masks.txt, line 4: no [MASK] in 'the mat'",
        _blank_lines,
    ),
    "classify-image/too many pixels": Case(
        "classify-image --checkpoint {vit} {tmp}/huge.png",
        2,
        "huge.png: the image is too large to decode (12000 × 12000 = 144,000,000 pixels; the "
        "limit is 64,000,000 pixels)",
        _huge_png("huge.png"),
    ),
    "attention/image with too many pixels": Case(
        "attention --checkpoint {vit} --image {tmp}/huge.png --out {tmp}/m",
        2,
        "the image is too large to decode",
        _huge_png("huge.png"),
    ),
    # -- hostile files: checkpoints, run folders, bounds -----------------------------------------
    "translate/the weights' line deleted from SHA256SUMS": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt",
        2,
        "hostile/model.safetensors: not listed in SHA256SUMS",
        _hostile_ckpt(_drop_sum_line("model.safetensors")),
    ),
    "translate/the tokenizer's line deleted from SHA256SUMS": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt",
        2,
        "hostile/tokenizer.json: not listed in SHA256SUMS",
        _hostile_ckpt(_drop_sum_line("tokenizer.json")),
    ),
    "translate/a file the checkpoint does not list": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt",
        2,
        "hostile/extra.py: not listed in SHA256SUMS, so not part of the checkpoint",
        _hostile_ckpt(lambda c: (c / "extra.py").write_text("import os")),
    ),
    "translate/weights linked to /dev/zero": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt",
        2,
        "hostile/model.safetensors: a symbolic link, not a regular file",
        _hostile_ckpt(_replace_weights(lambda w: w.symlink_to("/dev/zero"))),
    ),
    "translate/weights linked to a copy outside": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt",
        2,
        "hostile/model.safetensors: a symbolic link, not a regular file",
        _hostile_ckpt(_replace_weights(lambda w: w.symlink_to(w.parents[1] / "intact" / w.name))),
    ),
    "translate/weights are a FIFO": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt",
        2,
        "hostile/model.safetensors: a FIFO, not a regular file",
        _hostile_ckpt(_replace_weights(os.mkfifo)),
    ),
    "translate/state.json is a FIFO": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt",
        2,
        "hostile/state.json: a FIFO, not a regular file",
        _hostile_ckpt(lambda c: ((c / "state.json").unlink(), os.mkfifo(c / "state.json"))),
    ),
    "translate/SHA256SUMS names /dev/zero": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt",
        2,
        "names '/dev/zero', not a file of the checkpoint folder",
        _hostile_ckpt(_add_sum_line("/dev/zero")),
    ),
    "translate/SHA256SUMS names ../../etc/passwd": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt",
        2,
        "names '../../etc/passwd', not a file of the checkpoint folder",
        _hostile_ckpt(_add_sum_line("../../etc/passwd")),
    ),
    "translate/format_version a string": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt",
        2,
        'state.json: format_version="two" has the wrong type (expected an integer)',
        _hostile_ckpt(_state_field("format_version", "two")),
    ),
    "translate/model_config a list": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt",
        2,
        "state.json: model_config=[1, 2] has the wrong type (expected a JSON object)",
        _hostile_ckpt(_state_field("model_config", [1, 2])),
    ),
    "translate/beam of a trillion": Case(
        "translate --checkpoint {mt} -i {tmp}/one.txt --beam 1000000000000",
        2,
        "argument --beam: must be in [1, 1000], got 1000000000000",
    ),
    "generate/beam of a trillion": Case(
        "generate --checkpoint {gpt2} --beam 1000000000000 hi",
        2,
        "argument --beam: must be in [1, 1000], got 1000000000000",
    ),
    "translate/tuned_alpha.json with a huge beam": Case(
        "translate --checkpoint {tmp}/hostile -i {tmp}/one.txt --alpha auto",
        2,
        "tuned_alpha.json: beam_size must be an integer in [1, 1000] "
        "(aiayn.limits.MAX_BEAM_SIZE), got 1000000000000",
        _hostile_ckpt(_tuned_beam(10**12)),
    ),
    "explain/20,000 tokens": Case(
        f"explain --tokens '{_MANY_WORDS}'",
        2,
        "tokens=20,000 is more than explain traces (at most 64, aiayn.limits.MAX_EXPLAIN_TOKENS)",
    ),
    "explain/d_model of 200,000": Case(
        "explain --d-model 200000", 2, "d_model=200,000 is more than explain traces (at most 512"
    ),
    "explain/128 heads": Case(
        "explain --d-model 128 --heads 128", 2, "heads=128 is more than explain traces"
    ),
    "explain/weights from a FIFO": Case(
        "explain --weights {tmp}/w.fifo",
        2,
        "not a regular file",
        lambda tmp, _: os.mkfifo(tmp / "w.fifo"),
    ),
    "train/a run folder another run holds": Case(
        "train --run-dir {tmp}/run",
        2,
        f"{{tmp}}/run is in use by another aiayn train (pid {os.getpid()}, which holds "
        "{tmp}/run/run.lock)",
        _locked_run,
    ),
    "train/--force never deletes a locked run": Case(
        "train --run-dir {tmp}/run --force",
        2,
        f"is in use by another aiayn train (pid {os.getpid()}",
        _locked_run,
    ),
    "train/a data error leaves no run folder behind": Case(
        "train --set data.train_src={tmp}/nope.tsv --run-dir {tmp}/new/deep/run",
        2,
        "corpus file not found: {tmp}/nope.tsv",
    ),
    "train/an LM data error leaves no tokenizer behind": Case(
        "train --demo lm --set data.train_text={tmp}/lm.txt --set data.valid_text={tmp}/lm.txt "
        "--set data.block_size=100 --run-dir {tmp}/run",
        2,
        "the training text needs more than data.block_size=100 tokens",
        _short_lm_text,
    ),
}


def _argv(template: str, tmp: Path, ckpts: dict[str, Path]) -> list[str]:
    import shlex

    return [a.format(tmp=tmp, **ckpts) for a in shlex.split(template)]


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``main(argv)``; argparse's exits included."""
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line_error(err: str, command: str, fragment: str) -> None:
    """One error line ``aiayn COMMAND: error: …`` holding ``fragment``, no traceback; before it
    only argparse's usage synopsis, if anything."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert lines, "nothing on stderr"
    if len(lines) > 1:
        assert lines[0].startswith("usage: "), err
    assert lines[-1].startswith(f"aiayn {command}: error: "), err
    assert fragment in lines[-1], err


def test_the_catalogue_covers_every_command() -> None:
    commands = {name.split("/")[0] for name in CASES}
    assert len(CASES) >= 40
    assert commands >= {
        "train", "translate", "evaluate", "average", "attention", "explain", "generate",
        "fill-mask", "embed", "classify-image", "convert", "params", "experiment", "quantize",
    }  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(
    name: str,
    ckpts: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    case = CASES[name]
    _bad_files(tmp_path, ckpts)
    if case.setup is not None:
        case.setup(tmp_path, monkeypatch)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)  # the default output folders land here, if anywhere
    argv = _argv(case.argv, tmp_path, ckpts)
    status, _, err = run_cli(capsys, argv)
    assert status == case.status, err
    assert_one_line_error(err, argv[0], case.fragment.format(tmp=tmp_path))
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert after == before  # nothing written, nothing left behind


# -- reading errors the operating system raises, and bugs ------------------------------------


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes regardless of permissions")
def test_unreadable_input_and_read_only_folder_for_real(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    locked = tmp_path / "locked.txt"
    locked.write_text("hello\n")
    locked.chmod(0)
    status, _, err = run_cli(capsys, ["evaluate", "--hyp", str(locked), "--ref", str(locked)])
    assert status == 2
    assert_one_line_error(err, "evaluate", str(locked))
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    (tmp_path / "in.txt").write_text("hello\n")
    argv = ["translate", "--checkpoint", str(ckpts["mt"]), "-i", str(tmp_path / "in.txt")]
    status, _, err = run_cli(capsys, [*argv, "-o", str(ro / "out.txt")])
    assert status == 2
    assert_one_line_error(err, "translate", f"cannot write in {ro}")


@pytest.mark.parametrize(
    ("error", "fragment"),
    [
        (PermissionError(errno.EACCES, "Permission denied", "/data/w.json"), "/data/w.json: Per"),
        (IsADirectoryError(errno.EISDIR, "Is a directory", "/data"), "/data: Is a directory"),
        (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not valid UTF-8"),
        (MemoryError(), "out of memory"),
    ],
)
def test_operating_system_errors_are_one_line(
    error: BaseException,
    fragment: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr("aiayn.cli.explain.load_weights", fail)
    status, _, err = run_cli(capsys, ["explain", "--weights", "w.json"])
    assert status == 2
    assert_one_line_error(err, "explain", fragment)


@pytest.mark.parametrize("error", [RuntimeError("boom"), OSError(errno.EBADF, "Bad fd")])
def test_a_bug_keeps_its_traceback_and_asks_for_a_report(
    error: BaseException, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr("aiayn.cli.explain.build_trace", fail)
    status, _, err = run_cli(capsys, ["explain"])
    assert status == 1
    lines = err.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert str(error) in err and "please report it" in lines[-1]
    assert lines[-1].startswith("aiayn: internal error")


def test_a_closed_pipe_ends_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr("aiayn.cli.explain.format_trace", fail)
    status, _, err = run_cli(capsys, ["explain"])
    assert status == 0 and err == ""


def test_running_out_of_memory_is_one_line_and_no_bar_is_drawn_after_it(
    ckpts: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """torch's CPU allocator refusing a search's tensors (a RuntimeError, not a MemoryError) is
    one line, and the progress bar is closed before it."""

    def huge(*args: Any, **kwargs: Any) -> Any:
        # 2^62 bytes: more than any address space, so refused whatever the overcommit policy
        return torch.empty(2**62, dtype=torch.uint8)

    monkeypatch.setattr("aiayn.decoding.translate._translate_batch", huge)
    (tmp_path / "in.txt").write_text("hello world\n")
    argv = ["translate", "--checkpoint", str(ckpts["mt"]), "-i", str(tmp_path / "in.txt")]
    status, out, err = run_cli(capsys, argv)
    assert status == 2 and out == "" and "Traceback" not in err, err
    last = err.rstrip("\n").split("\n")[-1]
    assert last == (
        "aiayn translate: error: out of memory (you tried to allocate 4611686018427387904 bytes): "
        "try a smaller batch, beam or input"
    ), err


def test_a_multi_line_message_is_printed_on_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiayn.errors import UserError

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise UserError("not valid YAML: while parsing\n  in line 2:\n    [1\n    ^\nexpected ]")

    monkeypatch.setattr("aiayn.cli.explain.build_trace", fail)
    status, _, err = run_cli(capsys, ["explain"])
    assert status == 2
    assert err == "aiayn explain: error: not valid YAML: while parsing in line 2: [1 expected ]\n"


# -- no clobbering, per command ------------------------------------------------------------------


def _hidden(folder: Path) -> list[str]:
    """Temporary files or folders (all hidden) left in ``folder``."""
    return sorted(p.name for p in folder.rglob(".*"))


def test_translate_output_needs_force(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in.txt").write_text("hello world\nthe cat\n")
    out = tmp_path / "out.txt"
    out.write_text("mine\n")
    out.chmod(0o640)
    argv = ["translate", "--checkpoint", str(ckpts["mt"]), "-i", str(tmp_path / "in.txt")]
    argv += ["--beam", "1", "-o", str(out)]
    status, _, err = run_cli(capsys, argv)
    assert status == 2 and out.read_text() == "mine\n"
    assert_one_line_error(err, "translate", f"{out} exists: pass --force to replace it")
    assert run_cli(capsys, [*argv, "--force"])[0] == 0
    assert out.read_text().count("\n") == 2 and out.stat().st_mode & 0o777 == 0o640
    assert _hidden(tmp_path) == []


def test_evaluate_hypotheses_need_force(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("hello world\n")
    ref.write_text("Hallo Welt\n")
    hyp = tmp_path / "src.txt.hyp"
    hyp.write_text("mine\n")
    argv = ["evaluate", "--checkpoint", str(ckpts["mt"]), "--src", str(src), "--ref", str(ref)]
    argv += ["--beam", "1"]
    status, _, err = run_cli(capsys, argv)
    assert status == 2 and hyp.read_text() == "mine\n"
    assert_one_line_error(err, "evaluate", f"{hyp} exists: pass --force")
    status, out, _ = run_cli(capsys, [*argv, "--force"])
    assert status == 0 and "BLEU = " in out and hyp.read_text() != "mine\n"
    elsewhere = tmp_path / "hyps" / "out.txt"
    assert run_cli(capsys, [*argv, "--hyp-out", str(elsewhere)])[0] == 0
    assert elsewhere.read_text() == hyp.read_text()
    assert _hidden(tmp_path) == []


def test_embed_writes_exactly_out_and_needs_force(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in.txt").write_text("the cat\nthe mat\n")
    out = tmp_path / "vectors"  # no .npy: written as named, not as vectors.npy
    argv = ["embed", "--checkpoint", str(ckpts["bert"]), "-i", str(tmp_path / "in.txt")]
    assert run_cli(capsys, [*argv, "--out", str(out)])[0] == 0
    first = np.load(out)
    assert first.shape == (2, 32) and not (tmp_path / "vectors.npy").exists()
    status, _, err = run_cli(capsys, [*argv, "--out", str(out)])
    assert status == 2
    assert_one_line_error(err, "embed", "pass --force")
    assert run_cli(capsys, [*argv, "--out", str(out), "--force"])[0] == 0
    np.testing.assert_array_equal(np.load(out), first)
    assert _hidden(tmp_path) == []


def test_average_replaces_only_with_force_and_survives_a_full_disk(
    ckpts: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run" / "checkpoints"
    for step in (1, 2):
        shutil.copytree(ckpts["mt"], run / f"step_0000000{step}")
    training = sorted(p.name for p in (run / "step_00000002").iterdir())
    argv = ["average", "--run-dir", str(tmp_path / "run"), "--last", "2", "--out"]
    # a training checkpoint is refused, existing or not, without --force
    for name in ("step_00000002", "step_00000003", "best", "averaged"):
        status, _, err = run_cli(capsys, [*argv, str(run / name)])
        assert status == 2
        assert_one_line_error(err, "average", "pass --force")
    assert sorted(p.name for p in (run / "step_00000002").iterdir()) == training
    assert sorted(p.name for p in run.iterdir()) == ["step_00000001", "step_00000002"]

    out = tmp_path / "avg"
    status, stdout, err = run_cli(capsys, [*argv[:-2], "3", "--out", str(tmp_path / "avg3")])
    assert status == 0 and "holds 2 checkpoint(s); averaging all of them (--last 3)" in err
    assert "averaged 2 checkpoints (step_00000001, step_00000002)" in stdout
    assert run_cli(capsys, [*argv, str(out)])[0] == 0
    status, _, err = run_cli(capsys, [*argv, str(out)])
    assert status == 2
    assert_one_line_error(err, "average", f"{out} exists: pass --force")
    marker = out / "state.json"
    before = marker.read_bytes()

    def full_disk(paths: list[Path], staged: Path) -> Path:
        staged.mkdir()
        (staged / "model.safetensors").write_bytes(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("aiayn.checkpoint.average_checkpoints", full_disk)
    status, _, err = run_cli(capsys, [*argv, str(out), "--force"])
    assert status == 2
    assert_one_line_error(err, "average", f"cannot write {out}: No space left on device")
    assert marker.read_bytes() == before and (out / "model.safetensors").stat().st_size > 100
    assert _hidden(tmp_path) == []
    monkeypatch.undo()
    assert run_cli(capsys, [*argv, str(out), "--force"])[0] == 0
    assert _hidden(tmp_path) == []


def test_attention_maps_need_force_and_other_files_stay(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "maps"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["attention", "--checkpoint", str(ckpts["mt"]), "--src", "hello world", "--out"]
    assert run_cli(capsys, [*argv, str(out), "--no-png"])[0] == 0
    status, _, err = run_cli(capsys, [*argv, str(out), "--no-png"])
    assert status == 2
    assert_one_line_error(err, "attention", "already holds attention.html")
    (out / "attention.html").write_text("old")
    assert run_cli(capsys, [*argv, str(out), "--no-png", "--force"])[0] == 0
    assert "<html" in (out / "attention.html").read_text()

    argv = ["attention", "--checkpoint", str(ckpts["vit"]), "--image", str(tmp_path / "i.png")]
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(tmp_path / "i.png")
    (out / "attention.html").unlink()
    assert run_cli(capsys, [*argv, "--out", str(out)])[0] == 0
    assert {"attention.html", "cls_L1_H4.png", "rollout.png"} <= {p.name for p in out.iterdir()}
    (out / "attention.html").unlink()  # the PNGs alone are in the way too
    status, _, err = run_cli(capsys, [*argv, "--out", str(out)])
    assert status == 2
    assert_one_line_error(err, "attention", "already holds cls_L1_H1.png")
    assert run_cli(capsys, [*argv, "--out", str(out), "--force"])[0] == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "attention.html").is_file()
    assert _hidden(tmp_path) == []


def test_convert_back_replaces_only_a_hugging_face_folder(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hf"
    argv = ["convert", "--checkpoint", str(ckpts["gpt2"]), "--to-hf", str(out)]
    assert run_cli(capsys, argv)[0] == 0
    assert (out / "config.json").is_file()
    status, _, err = run_cli(capsys, argv)
    assert status == 2
    assert_one_line_error(err, "convert", f"{out} exists: pass --force")
    (out / "stale.txt").write_text("old")
    assert run_cli(capsys, [*argv, "--force"])[0] == 0
    assert not (out / "stale.txt").exists() and (out / "config.json").is_file()
    assert _hidden(tmp_path) == []


# -- hostile files: what the catalogue cannot see ------------------------------------------------


@pytest.mark.parametrize("kind", ["garbage", "empty", "text", "pickle"])
def test_a_refused_pytorch_bin_never_advises_weights_only_false_nor_runs_its_payload(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _hf_bin(kind)(tmp_path, pytest.MonkeyPatch())
    argv = ["convert", "--from-hf", str(tmp_path / "hf"), "--to", str(tmp_path / "c")]
    status, _, err = run_cli(capsys, argv)
    assert status == 2
    assert_one_line_error(err, "convert", "pytorch_model.bin: cannot read the weights")
    assert "weights_only" not in err and "False" not in err
    assert not (tmp_path / "PAYLOAD_RAN").exists() and not (tmp_path / "c").exists()


def test_the_payload_would_run_if_unpickled_unsafely(tmp_path: Path) -> None:
    """The pickle case above is a real payload: torch.load without weights_only runs it."""
    _hf_bin("pickle")(tmp_path, pytest.MonkeyPatch())
    torch.load(tmp_path / "hf" / "pytorch_model.bin", weights_only=False)
    assert (tmp_path / "PAYLOAD_RAN").exists()


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs /dev/full")
def test_force_over_a_device_or_a_link_replaces_neither(
    ckpts: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _bad_files(tmp_path, ckpts)
    for name in ("embed/--force over a full device", "average/--force over a link to a checkpoint",
                 "attention/--force over a link among its files"):  # fmt: skip
        case = CASES[name]
        if case.setup is not None:
            case.setup(tmp_path, monkeypatch)
        assert run_cli(capsys, _argv(case.argv, tmp_path, ckpts))[0] == 2
    full = tmp_path / "full"
    assert full.is_symlink() or stat.S_ISCHR(full.lstat().st_mode)
    assert (tmp_path / "linked").is_symlink() and os.readlink(tmp_path / "linked") == "truncated"
    assert (tmp_path / "links" / "attention.html").is_symlink()
    assert (tmp_path / "one.txt").read_text() == "hello world\n"


def test_fill_mask_skips_blank_lines(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in.txt").write_text("the [MASK]\n\n  \n[MASK] cat\n")
    argv = ["fill-mask", "--checkpoint", str(ckpts["bert"]), "-i", str(tmp_path / "in.txt")]
    status, out, err = run_cli(capsys, [*argv, "--top-k", "2"])
    assert status == 0, err
    blocks = out.strip("\n").split("\n\n")
    assert [len(block.splitlines()) for block in blocks] == [2, 2]
    assert all(line.split("\t")[2].endswith("cat") for line in blocks[1].splitlines())


def test_a_huge_image_is_refused_without_pillows_warning(
    ckpts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png_header(tmp_path / "huge.png", 12000, 12000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        argv = ["classify-image", "--checkpoint", str(ckpts["vit"]), str(tmp_path / "huge.png")]
        status, _, err = run_cli(capsys, argv)
    assert status == 2
    assert_one_line_error(err, "classify-image", "the image is too large to decode")
    assert [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)] == []
